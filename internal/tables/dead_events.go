package tables

import "strings"

// DeadEvents are the statements on dead_events, the events the relay gave
// up on.
type DeadEvents struct {
	// List reads up to $5 dead events with ids above $4, lowest first, of
	// status $1, aggregate type $2 and id $3 where those are not NULL.
	List string
	// ListBrief is List reading, of each event, the first 256 bytes of its
	// payload and of its last error, and no headers.
	ListBrief string
	// Replay puts dead event $1 back into events under its original id
	// and marks it replayed; it touches no row when the event is not dead.
	Replay string
	// Discard marks dead event $1 discarded; it touches no row when the
	// event is not dead.
	Discard string
}

// deadEventsList reads dead events; {payload}, {headers} and {last_error}
// are the whole columns, or for a brief listing their first bytes and no
// headers.
const deadEventsList = `
SELECT id, event_id::text AS event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type,
       topic, content_type, {payload} AS payload, {headers} AS headers, created_at, attempts, {last_error} AS last_error, hold, status,
       died_at, resolved_at, coalesce(octet_length(payload), 0) AS payload_size
FROM {schema}.dead_events
WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR aggregate_type = $2) AND ($3::text IS NULL OR aggregate_id = $3)
  AND id > $4
ORDER BY id
LIMIT $5`

func deadEvents(q func(string) string) DeadEvents {
	return DeadEvents{
		List: q(strings.NewReplacer("{payload}", "payload", "{headers}", "headers", "{last_error}", "last_error").Replace(deadEventsList)),
		ListBrief: q(strings.NewReplacer("{payload}", "substring(payload for 256)", "{headers}", "NULL::jsonb",
			"{last_error}", "left(last_error, 256)").Replace(deadEventsList)),
		Replay: q(`
WITH revived AS (
    UPDATE {schema}.dead_events SET status = 'replayed', resolved_at = now()
    WHERE id = $1 AND status = 'dead'
    RETURNING *
)
INSERT INTO {schema}.events (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
                             event_type, topic, content_type, payload, headers, created_at)
OVERRIDING SYSTEM VALUE
SELECT id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
       event_type, topic, content_type, payload, headers, created_at
FROM revived`),
		Discard: q(`
UPDATE {schema}.dead_events SET status = 'discarded', resolved_at = now()
WHERE id = $1 AND status = 'dead'`),
	}
}
