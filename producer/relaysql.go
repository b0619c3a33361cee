package producer

// relaySQL holds the relay's statements with the schema filled in.
type relaySQL struct {
	claim, heartbeat, leasedBuckets, setIdle, leave  string
	markDelivered, release, recordFailures, moveDead string
}

func newRelaySQL(schema string) relaySQL {
	return relaySQL{
		claim:          qualify(claimSQL, schema),
		heartbeat:      qualify(heartbeatSQL, schema),
		leasedBuckets:  qualify(leasedBucketsSQL, schema),
		setIdle:        qualify(setIdleSQL, schema),
		leave:          qualify(`DELETE FROM {schema}.relays WHERE relay_id = $1`, schema),
		markDelivered:  qualify(markDeliveredSQL, schema),
		release:        qualify(`UPDATE {schema}.events SET leased_until = NULL WHERE id = ANY($1::bigint[]) AND published_at IS NULL`, schema),
		recordFailures: qualify(recordFailuresSQL, schema),
		moveDead:       qualify(moveDeadSQL, schema),
	}
}

// claimSQL leases the next batch in the given buckets and returns it.
//
// Candidates are the lowest-id due rows, read through the partial index on
// undelivered rows and locked with SKIP LOCKED so that a concurrent claim
// never waits. The row locks last only for this statement: the lease in
// leased_until is what reserves the rows while they are published.
//
// A candidate is left out when an earlier undelivered row of its aggregate
// failed and is not in this batch (it is waiting out its backoff), or when
// its aggregate has a held dead event: either way, publishing it would put
// a later event on the wire before an earlier one. The failed-rows index is
// almost always empty, so these anti-joins cost next to nothing.
const claimSQL = `
WITH candidates AS (
    SELECT id, aggregate_type, aggregate_id
    FROM {schema}.events
    WHERE published_at IS NULL
      AND next_attempt_at <= now()
      AND (leased_until IS NULL OR leased_until < now())
      AND ` + bucketExpr + ` = ANY($1::int[])
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), ready AS (
    SELECT c.id FROM candidates c
    WHERE NOT EXISTS (
            SELECT 1 FROM {schema}.events f
            WHERE f.published_at IS NULL AND f.attempts > 0
              AND f.aggregate_type = c.aggregate_type AND f.aggregate_id = c.aggregate_id
              AND f.id < c.id
              AND f.id NOT IN (SELECT id FROM candidates))
      AND NOT EXISTS (
            SELECT 1 FROM {schema}.dead_events d
            WHERE d.status = 'dead' AND d.hold
              AND d.aggregate_type = c.aggregate_type AND d.aggregate_id = c.aggregate_id)
)
UPDATE {schema}.events e
SET leased_until = now() + $3 * interval '1 millisecond'
FROM ready
WHERE e.id = ready.id
RETURNING ` + claimedColumns

// heartbeatSQL renews this instance's row and counts the live instances;
// rows dead for ten times the staleness are swept here too.
const heartbeatSQL = `
WITH beat AS (
    INSERT INTO {schema}.relays (relay_id, heartbeat_at, idle_until)
    VALUES ($1, now(), CASE WHEN $2 THEN now() + $3 * interval '1 millisecond' END)
    ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, idle_until = excluded.idle_until
), sweep AS (
    DELETE FROM {schema}.relays WHERE heartbeat_at < now() - 10 * $4 * interval '1 millisecond' AND relay_id <> $1
)
SELECT 1 + count(*) FROM {schema}.relays
WHERE heartbeat_at > now() - $4 * interval '1 millisecond' AND relay_id <> $1`

// leasedBucketsSQL finds buckets that still have rows leased to an earlier
// owner, and when the last lease ends.
const leasedBucketsSQL = `
SELECT ` + bucketExpr + ` AS bucket, max(leased_until)
FROM {schema}.events
WHERE published_at IS NULL AND leased_until > now() AND ` + bucketExpr + ` = ANY($1::int[])
GROUP BY 1`

const setIdleSQL = `
UPDATE {schema}.relays SET idle_until = now() + $2 * interval '1 millisecond' WHERE relay_id = $1`

const markDeliveredSQL = `
UPDATE {schema}.events SET published_at = now(), leased_until = NULL
WHERE id = ANY($1::bigint[]) AND published_at IS NULL`

// recordFailuresSQL counts an attempt on each failed row and schedules its
// retry; permanent errors also count towards the dead-event cap.
const recordFailuresSQL = `
UPDATE {schema}.events e
SET attempts = e.attempts + 1,
    permanent_failures = e.permanent_failures + f.permanent,
    last_error = f.error,
    next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
    leased_until = NULL
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[]) AS f(id, permanent, error, delay_ms)
WHERE e.id = f.id AND e.published_at IS NULL`

// moveDeadSQL moves rows that reached the cap out of events, keeping every
// column and the last error, so the event can be replayed as it was.
const moveDeadSQL = `
WITH gone AS (
    DELETE FROM {schema}.events
    WHERE id = ANY($1::bigint[]) AND published_at IS NULL AND permanent_failures >= $2
    RETURNING *
)
INSERT INTO {schema}.dead_events (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
                                  event_type, topic, content_type, payload, headers, created_at,
                                  attempts, last_error, hold)
SELECT id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
       event_type, topic, content_type, payload, headers, created_at,
       attempts, coalesce(last_error, ''), $3
FROM gone
RETURNING id, aggregate_type, aggregate_id, aggregate_seq, last_error`
