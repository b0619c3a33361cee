package tables

import (
	"crypto/md5" //nolint:gosec // names a channel, guards nothing; relays of every version must agree on it
	"encoding/hex"
	"hash/fnv"
	"strconv"
)

// Writer are the statements of producer.Writer on events and sequences:
// one event or several, each without and with the wake-up check
// (wakeColumns). Parameters: see insertEvent and insertEvents.
type Writer struct {
	// InsertOne writes one event: $1 event id, $2 idempotency key, $3 and
	// $4 aggregate type and id, $5 event type, $6 topic, $7 content type,
	// $8 payload, $9 headers (NULL for none); it returns its id and
	// sequence.
	InsertOne string
	// InsertOneWake is InsertOne that also wakes an idle relay and says
	// what it did (WakeNoneIdle, WakeOtherNotifies, WakeNotified) and
	// whether the answer is fresh.
	InsertOneWake string
	// InsertMany writes the events of arrays $1 to $9 (InsertOne's
	// parameters, one element per event) and returns each one's id, event
	// id and sequence, in the order given.
	InsertMany string
	// InsertManyWake is InsertMany with InsertOneWake's wake-up check.
	InsertManyWake string
	// Moved finds, of the aggregates of arrays $1 (types) and $2 (ids),
	// those moved to another shard, the shard's name, and whether a move
	// from that shard has reserved the aggregate here but not opened it
	// yet; see moved.
	Moved string
}

// heldColumns are the values of attempts, next_attempt_at and last_error
// of a new event, in a query whose bumped row has the sequence's
// arriving_from and arriving_move. An event of an aggregate still arriving
// from another shard (package move) is inserted held: failed once, retry
// never, so that the relay's claim, which skips a failed row until its
// next attempt is due, leaves it and the aggregate's later events alone
// until the move releases them (setting them back to due) once the source
// delivered the earlier events. It is not dead: permanent_failures stays
// 0, so MaxAttempts never counts it. No trigger puts it in
// retrying_events (they fire on updates only), and none needs to: every
// later event of the aggregate is held too until the release, which takes
// the sequence row's lock first and so sees every held row committed
// before it. For an aggregate that never moved the CASEs cost a NULL test
// each.
const heldColumns = `CASE WHEN b.arriving_from IS NULL THEN 0 ELSE 1 END,
       CASE WHEN b.arriving_from IS NULL THEN now() ELSE 'infinity' END,
       CASE WHEN b.arriving_from IS NOT NULL
            THEN 'held: arriving from shard ' || b.arriving_from || ' (move ' || b.arriving_move || ')' END`

// HeldPrefix starts the last_error of an event held by a move
// (heldColumns); a release finds the held rows by it.
const HeldPrefix = "held: arriving from shard "

// moved explains why Write got fewer rows back than it wrote events: its
// upsert updates a sequence only where moved_to is NULL, so an aggregate
// moved to another shard returns no row and gets no event. It runs only
// then, in the writer's transaction, so the hot path pays no extra round
// trip; the sequence rows are already locked by the upsert.
const moved = `
SELECT s.aggregate_type, s.aggregate_id, s.moved_to, s.arriving_from IS NOT NULL
FROM {schema}.sequences s
JOIN unnest($1::text[], $2::text[]) AS a(aggregate_type, aggregate_id) USING (aggregate_type, aggregate_id)
WHERE s.moved_to IS NOT NULL
ORDER BY 1, 2`

// insertEvents writes a whole call in one round trip.
//
// The sequences upsert runs first and locks each aggregate's row in
// (aggregate_type, aggregate_id) order; a concurrent writer of the same
// aggregate waits there until this transaction ends, so sequence order is
// commit order, and the sorted order keeps two multi-aggregate writers from
// deadlocking each other. Events of one aggregate in one call get
// consecutive numbers, in call order. Ids are drawn after the lock, so they
// rise with the sequence too. {wake} is empty or wakeColumns.
//
// The upsert leaves a sequence moved to another shard (moved_to, package
// move) as it is and returns no row for it, so none of its events is
// inserted; the caller sees fewer rows than events and asks why (moved).
// The events of the call's other aggregates are inserted, and the caller
// must roll the transaction back. heldColumns holds the events of an
// aggregate still arriving from another shard.
const insertEvents = `
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::bytea[], $9::text[]) WITH ORDINALITY
        AS i(event_id, idempotency_key, aggregate_type, aggregate_id, event_type,
             topic, content_type, payload, headers, ord)
), counts AS (
    SELECT aggregate_type, aggregate_id, count(*) AS n
    FROM input GROUP BY aggregate_type, aggregate_id
), bumped AS (
    INSERT INTO {schema}.sequences AS s (aggregate_type, aggregate_id, last_seq)
    SELECT aggregate_type, aggregate_id, n FROM counts ORDER BY aggregate_type, aggregate_id
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = s.last_seq + excluded.last_seq
        WHERE s.moved_to IS NULL
    RETURNING aggregate_type, aggregate_id, last_seq, arriving_from, arriving_move
)
INSERT INTO {schema}.events (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
                             event_type, topic, content_type, payload, headers,
                             attempts, next_attempt_at, last_error)
SELECT i.event_id::uuid, i.idempotency_key, i.aggregate_type, i.aggregate_id,
       b.last_seq - c.n + row_number() OVER (PARTITION BY i.aggregate_type, i.aggregate_id ORDER BY i.ord),
       i.event_type, nullif(i.topic, ''), nullif(i.content_type, ''), i.payload, i.headers::jsonb,
       {held}
FROM input i
JOIN counts c USING (aggregate_type, aggregate_id)
JOIN bumped b USING (aggregate_type, aggregate_id)
ORDER BY i.ord
RETURNING id, event_id::text, aggregate_seq{wake}`

// insertEvent is insertEvents for the common single event: the same
// locking, without the array unpacking, grouping and window function, which
// cost more than the inserts themselves. The row comes out of bumped, so
// its id is drawn only after the upsert took the sequence row's lock: with
// the sequence as a scalar subquery of VALUES instead, the id could be drawn
// first, and a writer waiting for the lock would hold a lower id than the
// one it waits for, with a higher sequence; the relay, which publishes in
// id order, would then put them on the wire out of order. NULL parameters
// stand for no topic, no content type and no headers. A moved or
// arriving aggregate is treated as in insertEvents.
const insertEvent = `
WITH bumped AS (
    INSERT INTO {schema}.sequences AS s (aggregate_type, aggregate_id, last_seq)
    VALUES ($3, $4, 1)
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = s.last_seq + 1
        WHERE s.moved_to IS NULL
    RETURNING last_seq, arriving_from, arriving_move
)
INSERT INTO {schema}.events (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
                             event_type, topic, content_type, payload, headers,
                             attempts, next_attempt_at, last_error)
SELECT $1::uuid, $2, $3, $4, b.last_seq, $5, $6::text, $7::text, $8, coalesce($9::jsonb, '{}'),
       {held}
FROM bumped b
RETURNING id, aggregate_seq{wake}`

// wakeColumns are the last columns of a write's RETURNING when the write
// asks whether a relay is idle. The first is what the write did about it:
// WakeNoneIdle, WakeOtherNotifies or WakeNotified. The second says whether
// that answer is fresh, which it is only under READ COMMITTED (otherwise
// the statement reads the relays with the snapshot its transaction began
// with). The subquery is uncorrelated, so it runs once per statement however
// many rows the statement inserts, and its branches run only when reached.
// NOTIFY is transactional: the relays hear of it only if the writer commits.
//
// NOTIFY is not sent from every write because a notifying transaction takes
// a database-wide lock at commit and holds it across the WAL flush, so
// notifying writers commit one at a time (at 16 connections, with a relay
// idle, that cost three quarters of the commits). An idle relay has little
// to contend with; a busy one claims again straight after each batch and
// needs no signal. And while a relay is idle, only one write per wake slot
// (WakeSlotMillis of the statement's start time) notifies: the one that
// takes the slot's transaction-scoped advisory lock (key WakeLockKey, slot
// number); the writes that find it taken skip, and commit without the
// notification lock. The relay woken by the first claims what the others
// committed by then and keeps claiming while it finds work. If the
// notifying write rolls back, or its transaction runs on long after the
// write, the writes it covered wait for the first notifying write of a
// later slot to commit, or at worst for the relay's poll.
const wakeColumns = `, (SELECT CASE
        WHEN NOT EXISTS (SELECT FROM {schema}.relays WHERE idle_until > now()) THEN {none}
        WHEN NOT pg_try_advisory_xact_lock({wake_key}, ((extract(epoch FROM statement_timestamp()) * 1000)::bigint / {slot_ms} % 2147483647)::int) THEN {other}
        ELSE (SELECT {notified} FROM pg_notify('{channel}', ''))
    END),
    current_setting('transaction_isolation') = 'read committed'`

// What a write's wake-up column says (wakeColumns).
const (
	// WakeNoneIdle: no relay was idle; nothing was sent.
	WakeNoneIdle = 0
	// WakeOtherNotifies: a relay was idle, and another write of the same
	// wake slot notifies it when it commits; nothing was sent.
	WakeOtherNotifies = 1
	// WakeNotified: a relay was idle and the write notifies it when it
	// commits.
	WakeNotified = 2
)

// WakeSlotMillis is the length of a wake slot, in milliseconds: while a
// relay is idle, one write per slot notifies it (wakeColumns).
const WakeSlotMillis = 5

// WakeLockKey is the first key of the advisory locks by which writers of
// schema take turns to notify (wakeColumns); the second is the wake slot.
func WakeLockKey(schema string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte("outbox.wake:" + schema))
	return int32(h.Sum32()) //nolint:gosec // the hash's bits as an advisory lock key; wrapping is the point
}

// WakeChannel is the LISTEN/NOTIFY channel of a schema's relays: a hash of
// the schema, so that several outbox schemas in one database wake only their
// own relays and a long schema name cannot overflow the 63-byte limit on
// channel names. It is lower-case letters, digits and an underscore, safe
// as an identifier and inside a string literal.
func WakeChannel(schema string) string {
	sum := md5.Sum([]byte(schema)) //nolint:gosec // as the import says
	return "outbox_" + hex.EncodeToString(sum[:])[:16]
}

// ListenTo is the statement that listens on channel, a WakeChannel.
func ListenTo(channel string) string { return "LISTEN " + channel }

func writer(schema string) Writer {
	wake := Fill(wakeColumns, schema, "{channel}", WakeChannel(schema),
		"{wake_key}", strconv.Itoa(int(WakeLockKey(schema))), "{slot_ms}", strconv.Itoa(WakeSlotMillis),
		"{none}", strconv.Itoa(WakeNoneIdle), "{other}", strconv.Itoa(WakeOtherNotifies), "{notified}", strconv.Itoa(WakeNotified))
	build := func(sql, wakeColumns string) string {
		return Fill(sql, schema, "{wake}", wakeColumns, "{held}", heldColumns)
	}
	return Writer{
		InsertOne:      build(insertEvent, ""),
		InsertOneWake:  build(insertEvent, wake),
		InsertMany:     build(insertEvents, ""),
		InsertManyWake: build(insertEvents, wake),
		Moved:          Fill(moved, schema),
	}
}
