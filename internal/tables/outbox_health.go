package tables

// OutboxHealth are the reads of producer.Inspector.Health and
// producer.Inspector.Relays.
type OutboxHealth struct {
	// Read reads the health view.
	Read string
	// OldestError reads the last error of the oldest undelivered event:
	// the health view's own look at the oldest row, through the
	// undelivered rows' index, one row whatever the backlog.
	OldestError string
	// SlotExists says whether replication slot $1 exists in this
	// database.
	SlotExists string
	// Instances reads up to $2 rows of the relays table with each row's
	// bucket locks from pg_locks: advisory locks on two int4 keys show the
	// first key as classid (its bits as an unsigned oid, $1) and the
	// bucket as objid, objsubid 2. A schema has one row per running
	// instance.
	Instances string
}

func outboxHealth(q func(string) string) OutboxHealth {
	return OutboxHealth{
		Read: q(`SELECT undelivered, oldest_undelivered_seconds, dead, dispatch, cdc_slot,
       cdc_slot_active, cdc_retained_wal_bytes, cdc_lag_bytes FROM {schema}.health`),
		OldestError: q(`SELECT coalesce(last_error, '') FROM {schema}.events WHERE published_at IS NULL ORDER BY id LIMIT 1`),
		SlotExists:  `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database())`,
		Instances: q(`
SELECT r.relay_id, r.heartbeat_at, coalesce(r.idle_until > now(), false),
       r.session_pid IS NOT NULL AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = r.session_pid),
       coalesce((SELECT array_agg(l.objid::int8::int4 ORDER BY l.objid::int8) FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.granted AND l.pid = r.session_pid
                   AND l.objsubid = 2 AND l.classid::int8 = $1), '{}')
FROM {schema}.relays r
ORDER BY r.relay_id
LIMIT $2`),
	}
}
