package tables

// Dispatch are the statements of the dispatch mode (producer.SetDispatch,
// docs/cdc.md): the dispatch table, the events table's default and lock,
// and the catalog's publications and replication slots.
type Dispatch struct {
	// Read reads the mode, its slot and when it changed.
	Read string
	// Mode reads the mode and its slot, without a lock: a row lock
	// assigns a transaction id, after which the temporary slot of
	// SlotCopy could not be created.
	Mode string
	// LockMode reads the mode and locks its row.
	LockMode string
	// SetMode records mode $1 with slot $2.
	SetMode string
	// RelayDefault leaves published_at without a default: events wait
	// for the relay.
	RelayDefault string
	// CDCDefault writes every event as published: the connector streams
	// it from the WAL.
	CDCDefault string
	// LockEvents takes the lock that lets readers on and blocks every
	// write to events, the relay's marks included, until the transaction
	// ends.
	LockEvents string
	// CountUndelivered counts the undelivered events along the partial
	// index of undelivered events.
	CountUndelivered string
	// WALPosition reads the server's current WAL position.
	WALPosition string
	// Publications lists, comma-separated and quoted, the publications of
	// the events table of schema $1 (NULL when none).
	Publications string
	// Published says, for schema $1, whether its events table is in a
	// publication, whether one publishes it via the partition root, and
	// whether it is day-partitioned.
	Published string
	// Slot says whether replication slot $1 exists in this database, and
	// its plugin.
	Slot string
	// SlotCopy copies replication slot $1 into a temporary slot decoding
	// with pgoutput and returns the copy's name and the slot's confirmed
	// position.
	SlotCopy string
	// SlotPending decodes slot $1 (a copy) up to $2 (a WAL position; ""
	// for the current one) through publications $3 and counts the inserts
	// after position $4, and the WAL bytes from $4 to $2. 'I' is
	// pgoutput's insert message; lsn is the change's own position. Inserts
	// only: the connector ignores deletes (Prune) and the rest.
	SlotPending string
	// DropSlot drops replication slot $1.
	DropSlot string
}

func dispatch(q func(string) string) Dispatch {
	return Dispatch{
		Read:             q(`SELECT mode, slot_name, changed_at FROM {schema}.dispatch`),
		Mode:             q(`SELECT mode, slot_name FROM {schema}.dispatch`),
		LockMode:         q(`SELECT mode FROM {schema}.dispatch FOR UPDATE`),
		SetMode:          q(`UPDATE {schema}.dispatch SET mode = $1, slot_name = $2, changed_at = now()`),
		RelayDefault:     q(`ALTER TABLE {schema}.events ALTER COLUMN published_at DROP DEFAULT`),
		CDCDefault:       q(`ALTER TABLE {schema}.events ALTER COLUMN published_at SET DEFAULT now()`),
		LockEvents:       q(`LOCK TABLE {schema}.events IN EXCLUSIVE MODE`),
		CountUndelivered: q(`SELECT count(*) FROM {schema}.events WHERE published_at IS NULL`),
		WALPosition:      `SELECT pg_current_wal_lsn()::text`,
		Publications:     `SELECT string_agg(quote_ident(pubname), ',') FROM pg_publication_tables WHERE schemaname = $1 AND tablename = 'events'`,
		Published: `
SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE schemaname = $1 AND tablename = 'events'),
       coalesce((SELECT bool_or(p.pubviaroot) FROM pg_publication p
                 JOIN pg_publication_tables t ON t.pubname = p.pubname
                 WHERE t.schemaname = $1 AND t.tablename = 'events'), false),
       (SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(format('%I.events', $1::text)))`,
		Slot: `SELECT true, plugin FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`,
		SlotCopy: `
SELECT c.slot_name::text, s.confirmed_flush_lsn::text
FROM pg_replication_slots s,
     pg_copy_logical_replication_slot(s.slot_name, 'outbox_switch_back_' || pg_backend_pid(), true, 'pgoutput') c
WHERE s.slot_name = $1 AND s.database = current_database()`,
		SlotPending: `
SELECT count(*) FILTER (WHERE get_byte(data, 0) = ascii('I') AND lsn > $4::pg_lsn),
       greatest(pg_wal_lsn_diff(coalesce(nullif($2, '')::pg_lsn, pg_current_wal_lsn()), $4::pg_lsn), 0)::bigint
FROM pg_logical_slot_peek_binary_changes($1, coalesce(nullif($2, '')::pg_lsn, pg_current_wal_lsn()), NULL,
     'proto_version', '1', 'publication_names', $3)`,
		DropSlot: `SELECT pg_drop_replication_slot($1)`,
	}
}
