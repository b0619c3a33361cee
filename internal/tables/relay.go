package tables

// RelayBuckets is how many hash buckets the relays spread the aggregates
// over. It is fixed, not configuration: every instance must agree on it,
// and 64 allows up to 64 instances per database. bucketExprE computes a
// row's bucket with it.
const RelayBuckets = 64

// hashExprE is an event row's aggregate hash, in a query that calls the
// events table e: the value an aggregate's bucket derives from, and the
// value the claim compares to leave the aggregates in flight out. It is
// computed where rows are claimed rather than stored with every write.
// bucketExprE maps the hash to its bucket (0 to RelayBuckets-1); it must
// agree everywhere, and with the relay's bucketOf.
const (
	hashExprE   = `hashtext(e.aggregate_type || ':' || e.aggregate_id)`
	bucketExprE = `((` + hashExprE + ` % 64) + 64) % 64`
)

// claimedColumns are the columns of a claimed event, in the order the
// relay scans them, its bucket hash last.
const claimedColumns = `e.id, e.event_id::text, e.idempotency_key, e.aggregate_type, e.aggregate_id,
       e.aggregate_seq, e.event_type, e.topic, e.content_type, e.payload, e.headers,
       e.created_at, e.attempts, e.permanent_failures, ` + hashExprE

// Relay are the relay's statements on events, dead_events, relays and
// activity, and on the advisory locks of its buckets.
type Relay struct {
	// Claim leases the next batch of buckets $1 (at most $2 rows, for $3
	// milliseconds), leaving out the aggregates of hashes $4, and returns
	// it as claimedColumns and the lease; see claim.
	Claim string
	// Heartbeat renews relay $1's row (idle $2 for $3 milliseconds),
	// sweeps the dead ones and counts the live instances (staleness $4
	// milliseconds); see heartbeat.
	Heartbeat string
	// LeasedAggregates finds the leased aggregates of buckets $1 but those
	// of hashes $2; see leasedAggregates.
	LeasedAggregates string
	// SetIdle says relay $1 is idle for $2 more milliseconds.
	SetIdle string
	// Leave deletes relay $1's row: it stopped.
	Leave string
	// MarkDelivered marks the events $1 delivered.
	MarkDelivered string
	// Release gives the events $1 still under lease $2 back, unattempted.
	Release string
	// RecordFailures counts a failed attempt on each of the events $1; see
	// recordFailures.
	RecordFailures string
	// MoveDead moves the events $1 that failed permanently $2 times to
	// dead_events, holding their aggregates when $3; see moveDead.
	MoveDead string
	// RenewLease extends lease $2 of the events $1 by $3 milliseconds;
	// see renewLease.
	RenewLease string
	// AnyUndelivered says whether any event is undelivered. The partial
	// index on undelivered rows answers it at once.
	AnyUndelivered string
	// AddActivity and PruneActivity count the events delivered per
	// minute, under the relay's own id so that relays never wait on one
	// another's row (see Members).
	AddActivity, PruneActivity string
	// LockBuckets takes, of buckets $2 in order, the advisory locks (key
	// $1) free now, at most $3 of them, and returns those taken. Without
	// ORDER BY the function scan yields the array in order and the LIMIT
	// stops it, so no more locks are taken than wanted.
	LockBuckets string
	// UnlockBuckets gives up the advisory locks (key $1) of buckets $2.
	UnlockBuckets string
	// Listen listens on the schema's WakeChannel, where writers wake an
	// idle relay.
	Listen string
	// ClaimSession sets up the relay's lock session, where Claim runs, so
	// that the claim's cost does not depend on the table's statistics; see
	// claimSession.
	ClaimSession string
	// ClaimNoFlush turns synchronous commit off for the transaction it
	// runs in; the relay sends it in one implicit transaction with Claim.
	// See claimNoFlush for why that is safe.
	ClaimNoFlush string
	// ClaimPooled is ClaimSession and ClaimNoFlush for the transaction it
	// runs in only: a Fleet's shard sends it in one implicit transaction
	// with Claim on a connection of its pool, whose other transactions
	// (marks among them) must keep the server's settings.
	ClaimPooled string
}

func relay(q func(string) string, schema string) Relay {
	return Relay{
		Claim:            q(claim),
		Heartbeat:        q(heartbeat),
		LeasedAggregates: q(leasedAggregates),
		SetIdle:          q(setIdle),
		Leave:            q(`DELETE FROM {schema}.relays WHERE relay_id = $1`),
		MarkDelivered:    q(markDelivered),
		Release:          q(`UPDATE {schema}.events SET leased_until = NULL WHERE id = ANY($1::bigint[]) AND published_at IS NULL AND leased_until = $2`),
		RecordFailures:   q(recordFailures),
		MoveDead:         q(moveDead),
		RenewLease:       q(renewLease),
		AnyUndelivered:   q(`SELECT EXISTS (SELECT 1 FROM {schema}.events WHERE published_at IS NULL)`),
		AddActivity:      members(q).AddActivity,
		PruneActivity:    members(q).PruneActivity,
		LockBuckets:      `SELECT b FROM unnest($2::int[]) AS b WHERE pg_try_advisory_lock($1, b) LIMIT $3`,
		UnlockBuckets:    `SELECT pg_advisory_unlock($1, b) FROM unnest($2::int[]) AS b`,
		Listen:           ListenTo(WakeChannel(schema)),
		ClaimSession:     claimSession,
		ClaimNoFlush:     claimNoFlush,
		ClaimPooled:      claimPooled,
	}
}

// claim leases the next batch in the given buckets and returns it.
//
// Candidates are the lowest-id due rows, read through the partial index on
// undelivered rows. They are read first without locks and then locked one
// by one with SKIP LOCKED, so that a concurrent claim never waits; the row
// locks last only for this statement: the lease in leased_until is what
// reserves the rows while they are published.
//
// A candidate that could not be locked, or is leased, holds back the later
// candidates of its aggregate (skipped, below). Its lock may belong to a
// relay whose lease lapsed and that is still inside its settle
// transaction, recording the row's failure: that failure is not committed
// yet, so nothing else here knows the row failed, and claiming the
// aggregate's next row would put it on the wire first. A candidate that
// changed after this statement's snapshot (another session's commit)
// cannot be locked as read either and holds its aggregate back the same
// way, until the next claim sees the change. A leased candidate is in
// flight with another relay (or with a batch of this one whose outcome
// could not be recorded): the relay leaves such aggregates out by their
// hash ($4) once it knows of them, and this check covers a lease it does
// not know of yet, such as one renewed by a relay that lost its buckets
// while the new owner looked. Reading before locking is what makes the
// skipped rows visible at all: a locking scan passes them over without a
// trace. Every earlier undelivered row of an aggregate that could go out is
// itself a candidate (same filters, lower id), so none is missed.
//
// A row that never failed is due at once, whatever its next_attempt_at
// says: that column defaults to the start of the writing transaction, and
// the writer of an aggregate's earlier sequence may have begun after this
// claim's transaction (its now()) yet committed before its snapshot, while
// the writer of a later sequence began earlier and committed after it;
// comparing their rows with now() would leave the earlier sequences out and
// let the later one go first. next_attempt_at is a backoff only for a row
// that failed, and such a row holds back its aggregate's later rows through
// retrying_events (blocked, below).
//
// A row is not a candidate while an earlier undelivered row of its
// aggregate failed and is waiting out its backoff (or is leased again), or
// while its aggregate has a held dead event: publishing it would put a
// later event on the wire before an earlier one. These exclusions come
// before the LIMIT, so held rows never crowd healthy aggregates out of a
// batch. The blocking aggregates are computed once per claim, from small
// tables (retrying_events, kept by triggers, and the held dead_events) that
// are almost always empty, and materialized: left to the planner as
// correlated anti-joins, statistics taken before a backlog built up made it
// scan the whole undelivered index once per candidate, and claims took
// seconds.
//
// The exclusions are filters of the candidates' scan, not joins, so that
// the scan is one walk of events_undelivered in id order that the LIMIT
// stops after $2 rows passed, whatever the statistics say. As hash
// anti-joins, once autovacuum had analyzed a table whose rows were all
// delivered (the planner then expects one undelivered row), every claim
// read and sorted the whole backlog to keep $2 rows: O(backlog) per claim.
// NOT IN over a materialized CTE is a set hashed once per claim (the
// columns are NOT NULL, so it means NOT EXISTS); a row of a blocked
// aggregate is then compared with the aggregate's first blocking id, looked
// up by array_position in the blocks arrays, which only such rows pay. On
// the partitioned layout the walk is a Merge Append of the partitions'
// walks, which the lock session's settings (claimSession) keep the planner
// from trading for an Append and a sort on such statistics.
// BenchmarkRelayDrainAged measures the drain on such a table, and
// TestClaimWalksItsBatchNotTheBacklog checks the plan on both layouts.
//
// Each retrying event is looked up in events on its own (the
// LATERAL with LIMIT 1 keeps the planner from turning the lookups into a
// join that scans events; created_at, the partition key of the partitioned
// layout, lets each lookup touch one partition) and checked again there, so
// a stale entry blocks nothing. The candidates are locked the same way, by
// a LATERAL lookup each, found by their tuple id (ctid, and tableoid for the
// partitioned layout): one page each rather than an index descent. A row
// updated since the snapshot has moved to a new tuple id and is not locked,
// which holds its aggregate back as above. The UPDATE finds the ready rows
// by id through an array, an index scan per partition: joined to the CTE
// instead, misjudged row counts made the planner hash the whole partitioned
// table. BenchmarkClaim times this claim against a bare SKIP LOCKED claim;
// docs/performance.md has the figures.
//
// $4 lists the bucket hashes of the aggregates the claim leaves out (a
// hashed subplan, whatever its size): those of the batch still in flight,
// and those held because rows of theirs are leased elsewhere: to a relay
// that lost their bucket, or by a batch of this relay whose outcome could
// not be recorded (see bucketOwner.holds). Leaving them out before the
// LIMIT keeps their leased rows from filling the batch.
const claim = `
WITH retrying AS MATERIALIZED (
    SELECT e.id, e.aggregate_type, e.aggregate_id, e.next_attempt_at, e.leased_until
    FROM {schema}.retrying_events r
    CROSS JOIN LATERAL (
        SELECT id, aggregate_type, aggregate_id, next_attempt_at, leased_until
        FROM {schema}.events
        WHERE id = r.id AND created_at = r.created_at AND published_at IS NULL AND attempts > 0
        LIMIT 1) e
), blocked AS MATERIALIZED (
    SELECT aggregate_type, aggregate_id, min(id) AS first_id
    FROM retrying
    WHERE next_attempt_at > now() OR leased_until >= now()
    GROUP BY aggregate_type, aggregate_id
), blocks AS MATERIALIZED (
    SELECT array_agg(ROW(aggregate_type, aggregate_id) ORDER BY first_id) AS aggregates,
           array_agg(first_id ORDER BY first_id) AS first_ids
    FROM blocked
), held AS MATERIALIZED (
    SELECT DISTINCT aggregate_type, aggregate_id
    FROM {schema}.dead_events
    WHERE status = 'dead' AND hold
), candidates AS MATERIALIZED (
    SELECT e.tableoid, e.ctid, e.id, e.created_at, e.aggregate_type, e.aggregate_id
    FROM {schema}.events e
    WHERE e.published_at IS NULL
      AND (e.attempts = 0 OR e.next_attempt_at <= now())
      AND ` + bucketExprE + ` = ANY($1::int[])
      AND ` + hashExprE + ` NOT IN (SELECT unnest($4::int[]))
      AND ((e.aggregate_type, e.aggregate_id) NOT IN (SELECT aggregate_type, aggregate_id FROM blocked)
           OR e.id <= (SELECT first_ids FROM blocks)[
                          array_position((SELECT aggregates FROM blocks), ROW(e.aggregate_type, e.aggregate_id))])
      AND (e.aggregate_type, e.aggregate_id) NOT IN (SELECT aggregate_type, aggregate_id FROM held)
    ORDER BY e.id
    LIMIT $2
), locked AS MATERIALIZED (
    SELECT l.id, c.aggregate_type, c.aggregate_id
    FROM candidates c
    CROSS JOIN LATERAL (
        SELECT e.id
        FROM {schema}.events e
        WHERE e.ctid = c.ctid AND e.tableoid = c.tableoid AND e.id = c.id AND e.created_at = c.created_at
          AND e.published_at IS NULL
          AND (e.attempts = 0 OR e.next_attempt_at <= now())
          AND (e.leased_until IS NULL OR e.leased_until < now())
        FOR UPDATE OF e SKIP LOCKED) l
), skipped AS MATERIALIZED (
    SELECT aggregate_type, aggregate_id, min(id) AS first_id
    FROM candidates
    WHERE id NOT IN (SELECT id FROM locked)
    GROUP BY aggregate_type, aggregate_id
), ready AS (
    SELECT l.id FROM locked l
    WHERE NOT EXISTS (
            SELECT 1 FROM skipped s
            WHERE s.aggregate_type = l.aggregate_type AND s.aggregate_id = l.aggregate_id
              AND s.first_id < l.id)
)
UPDATE {schema}.events e
SET leased_until = now() + $3 * interval '1 millisecond'
WHERE e.id = ANY(ARRAY(SELECT id FROM ready))
RETURNING ` + claimedColumns + `, e.leased_until`

// claimSession is run once on each lock session of a relay, before its
// first claim. Without sorts, the only way the planner has to return the
// candidates in id order is to walk the undelivered index (a Merge Append
// of the partitions' indexes on the partitioned layout), which the LIMIT
// stops: on statistics that expect almost no undelivered row, PostgreSQL
// otherwise prefers an Append of the partitions and a sort, which reads
// the whole backlog on every claim. A sort the planner cannot avoid still
// runs, at a cost raised by 10^10; jit is off so that such a cost never
// makes it compile the statement, which would take seconds. The other
// statements of the session (heartbeat, bucket locks, leasedAggregates)
// need no sort.
const claimSession = `SELECT set_config('enable_sort', 'off', false), set_config('jit', 'off', false)`

// claimNoFlush runs in the claim's transaction, before Claim, so that its
// commit does not wait for the WAL to reach the disk: that flush was on
// the path of every event, between the writer's commit and the produce.
// The setting is transaction-local (set_config's third argument) and
// reaches nothing but the claim; the events, their marks (delivered,
// failed, dead), the lease renewals and everything the consumer writes
// stay synchronous. It is safe because of what an unflushed commit can and
// cannot lose:
//
//  1. Only a crash of the server (or its host) loses it. Visibility is
//     unchanged: the lease is visible to every session the moment the
//     claim commits, exactly as before, so while the server runs no other
//     relay can claim the rows.
//  2. The WAL is flushed in order, so any later synchronous commit makes
//     the claim durable with it; in particular the batch's marks, which
//     commit synchronously after the broker acknowledged it. A crash can
//     lose the lease only of a batch whose marks were not durable yet, so
//     those events are undelivered after it in any case and are published
//     again: a duplicate, which at-least-once allows, exactly as when a
//     relay dies after publishing and before marking.
//  3. Losing a lease puts its rows back to how they were before the claim:
//     undelivered and not leased (a claim takes only rows whose lease was
//     cleared, by a synchronous settle, or ended, or that had none; a
//     renewal is synchronous and so flushes the claim). That is the state
//     a lease reaches anyway when it lapses while its relay still waits for
//     the broker, which the claim already handles: the next claim starts
//     again from the aggregate's lowest undelivered row, so it never puts
//     seq n+1 on the wire before putting seq n there itself, whatever the
//     old relay's records do; an old relay's late failure record does not
//     touch rows whose lease it no longer matches (recordFailures), and a
//     late mark of an acknowledged event is right whoever claimed it last.
//  4. A server crash ends every session, and with them every relay's
//     bucket locks and holds: all relays start again from the state on
//     disk, as after a restart.
//
// So a claim lost in a crash is a claim that never happened while its
// relay went on publishing: the same as a relay that died before claiming
// as far as the table can tell, and a duplicate on the wire at worst.
const claimNoFlush = `SELECT set_config('synchronous_commit', 'off', true)`

// claimPooled sets, for the claim's own transaction, what claimSession
// sets for a lock session and what claimNoFlush sets for the claim: a
// claim on a pool connection leaves the connection as it found it.
const claimPooled = `SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true), set_config('synchronous_commit', 'off', true)`

// heartbeat renews this instance's row, with the pid of the lock
// session it runs on (which it also returns, for the relay to see that it
// stays the same), and counts the live instances: those with a fresh
// heartbeat whose lock session still exists (a row without a pid, from a
// relay built before migration 0006, by its heartbeat alone). Rows dead
// for ten times the staleness are swept here too. The staleness ($4,
// milliseconds) is cast: next to the integer 10, PostgreSQL would take it
// for an int4, which ends at 24.8 days.
const heartbeat = `
WITH beat AS (
    INSERT INTO {schema}.relays (relay_id, heartbeat_at, idle_until, session_pid)
    VALUES ($1, now(), CASE WHEN $2 THEN now() + $3 * interval '1 millisecond' END, pg_backend_pid())
    ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, idle_until = excluded.idle_until,
                                         session_pid = excluded.session_pid
), sweep AS (
    DELETE FROM {schema}.relays WHERE heartbeat_at < now() - 10 * $4::bigint * interval '1 millisecond' AND relay_id <> $1
)
SELECT 1 + count(*), pg_backend_pid() FROM {schema}.relays r
WHERE r.heartbeat_at > now() - $4 * interval '1 millisecond' AND r.relay_id <> $1
  AND (r.session_pid IS NULL OR EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = r.session_pid))`

// leasedAggregates finds the aggregates of the given buckets that have
// undelivered rows under a lease, leaving out those of the batch in flight
// ($2, bucket hashes), and in how many seconds their last lease ends
// (computed by the server, so clock skew between hosts does not matter).
// It reads the whole backlog of the buckets; it runs when buckets are taken
// and when a hold ends, not per claim.
const leasedAggregates = `
SELECT ` + bucketExprE + ` AS bucket, ` + hashExprE + ` AS hash, e.aggregate_type, e.aggregate_id,
       extract(epoch FROM max(e.leased_until) - now())::float8
FROM {schema}.events e
WHERE e.published_at IS NULL AND e.leased_until > now() AND ` + bucketExprE + ` = ANY($1::int[])
  AND ` + hashExprE + ` NOT IN (SELECT unnest($2::int[]))
GROUP BY 1, 2, 3, 4`

const setIdle = `
UPDATE {schema}.relays SET idle_until = now() + $2 * interval '1 millisecond' WHERE relay_id = $1`

const markDelivered = `
UPDATE {schema}.events SET published_at = now(), leased_until = NULL
WHERE id = ANY($1::bigint[]) AND published_at IS NULL`

// recordFailures counts an attempt on each failed row and schedules its
// retry; permanent errors also count towards the dead-event cap.
//
// Like Release and MoveDead, it touches only rows still under this batch's
// lease ($5, the lease the claim set): a relay whose lease ran out while it
// waited for the broker must not undo what a newer claim of the same rows
// did. Marking delivered needs no such check: an acknowledged event is on
// the wire whoever claimed it last.
const recordFailures = `
UPDATE {schema}.events e
SET attempts = e.attempts + 1,
    permanent_failures = e.permanent_failures + f.permanent,
    last_error = f.error,
    next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
    leased_until = NULL
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[]) AS f(id, permanent, error, delay_ms)
WHERE e.id = f.id AND e.published_at IS NULL AND e.leased_until = $5`

// moveDead moves rows that reached the cap out of events, keeping every
// column and the last error, so the event can be replayed as it was. It
// runs right after recordFailures in the same transaction, which cleared
// the lease of exactly the rows this batch still held.
const moveDead = `
WITH gone AS (
    DELETE FROM {schema}.events
    WHERE id = ANY($1::bigint[]) AND published_at IS NULL AND permanent_failures >= $2
      AND leased_until IS NULL
    RETURNING *
)
INSERT INTO {schema}.dead_events (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
                                  event_type, topic, content_type, payload, headers, created_at,
                                  attempts, last_error, hold)
SELECT id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
       event_type, topic, content_type, payload, headers, created_at,
       attempts, coalesce(last_error, ''), $3
FROM gone
-- An event replayed earlier that dies again takes its old row back.
ON CONFLICT (id) DO UPDATE SET
    attempts = excluded.attempts, last_error = excluded.last_error, hold = excluded.hold,
    status = 'dead', died_at = now(), resolved_at = NULL
RETURNING id, aggregate_type, aggregate_id, aggregate_seq, last_error`

// renewLease extends the lease of a batch's rows that still carry its
// lease, and returns the new lease (NULL when none did).
const renewLease = `
WITH renewed AS (
    UPDATE {schema}.events SET leased_until = now() + $3 * interval '1 millisecond'
    WHERE id = ANY($1::bigint[]) AND published_at IS NULL AND leased_until = $2
    RETURNING leased_until
)
SELECT max(leased_until) FROM renewed`
