package operator

import "github.com/d419a114/outbox/internal/tables"

// requestColumns are the columns every statement that reads requests
// returns, in the order Store.query scans them.
const requestColumns = `id, consumer, action, letter_id, topic, aggregate_type, aggregate_id, reason, failure, failed_after,
    failed_before, rate, requested_by, requested_at, status, started_at, finished_at,
    matched, applied, duplicates, discarded, failed, skipped, drained, error, claim`

// statements are the operator tables' statements in one schema.
type statements struct {
	// submit inserts a pending request and returns its id.
	submit string
	get    string
	// list reads up to $4 requests newest first, filtered by consumer $1,
	// status $2 and id below $3 where those are not NULL.
	list string
	// claim takes up consumer $1's oldest open request whose lease (if
	// any) ran out, under a lease of $2 seconds, and raises its claim;
	// SKIP LOCKED keeps two processes from claiming one (and skips a
	// request whose action is committing its count: the next poll takes
	// it).
	claim string
	// The fenced writes of the process holding claim $2 of request $1.
	// Each touches no row once another process has claimed the request
	// (claim moved on) or, but for finish, once it was cancelled.
	//
	// renew renews the lease for $3 seconds.
	renew string
	// count adds to the counts of what was done, in the transaction of
	// the action counted, and returns the sums. Its row lock, held until
	// that transaction ends, is why it comes last in the action.
	count string
	// report writes the run's counts and error and renews the lease for
	// $3 seconds.
	report string
	// finish writes the run's counts and error and ends the request with
	// status $3, or leaves it cancelled; it returns what is stored.
	finish string
	// fence reads why a fenced write touched nothing.
	fence string
	// lockStatus reads request $1's status, locking its row for cancel.
	lockStatus string
	// cancel ends request $1 as cancelled.
	cancel string
	// record inserts an audit row.
	record string
	// audit reads up to $4 audit rows newest first, filtered by consumer
	// $1, request $2 and id below $3 where those are not NULL.
	audit string
}

func statementsFor(schema string) statements {
	q := func(sql string) string { return tables.Fill(sql, schema) }
	run := `matched = $4, failed = $5, skipped = $6, error = $7`
	fenced := ` WHERE id = $1 AND claim = $2 AND status = 'running'`
	return statements{
		submit: q(`INSERT INTO {schema}.operator_requests (consumer, action, letter_id, topic, aggregate_type, aggregate_id,
    reason, failure, failed_after, failed_before, rate, requested_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id`),
		get: q(`SELECT ` + requestColumns + ` FROM {schema}.operator_requests WHERE id = $1`),
		list: q(`SELECT ` + requestColumns + ` FROM {schema}.operator_requests
WHERE ($1::text IS NULL OR consumer = $1) AND ($2::text IS NULL OR status = $2) AND ($3::bigint IS NULL OR id < $3)
ORDER BY id DESC LIMIT $4`),
		claim: q(`UPDATE {schema}.operator_requests
SET status = 'running', lease_until = now() + make_interval(secs => $2), started_at = coalesce(started_at, now()), claim = claim + 1
WHERE id = (SELECT id FROM {schema}.operator_requests
            WHERE consumer = $1 AND (status = 'pending' OR (status = 'running' AND lease_until < now()))
            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING ` + requestColumns),
		renew: q(`UPDATE {schema}.operator_requests SET lease_until = now() + make_interval(secs => $3)` + fenced),
		count: q(`UPDATE {schema}.operator_requests
SET applied = applied + $3, duplicates = duplicates + $4, discarded = discarded + $5, drained = drained + $6` + fenced + `
RETURNING applied, duplicates, discarded, drained`),
		report: q(`UPDATE {schema}.operator_requests SET lease_until = now() + make_interval(secs => $3), ` + run + fenced),
		finish: q(`UPDATE {schema}.operator_requests
SET status = CASE WHEN status = 'cancelled' THEN status ELSE $3 END, finished_at = coalesce(finished_at, now()), lease_until = NULL, ` + run + `
WHERE id = $1 AND claim = $2 AND status IN ('running', 'cancelled')
RETURNING status, applied, duplicates, discarded, drained`),
		fence:      q(`SELECT status, claim FROM {schema}.operator_requests WHERE id = $1`),
		lockStatus: q(`SELECT status FROM {schema}.operator_requests WHERE id = $1 FOR UPDATE`),
		cancel: q(`UPDATE {schema}.operator_requests SET status = 'cancelled', finished_at = now(), lease_until = NULL WHERE id = $1
RETURNING ` + requestColumns),
		record: q(`INSERT INTO {schema}.operator_audit (actor, consumer, action, request_id, letter_id, aggregate_type, aggregate_id, outcome, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`),
		audit: q(`SELECT id, at, actor, consumer, action, request_id, letter_id, aggregate_type, aggregate_id, outcome, detail
FROM {schema}.operator_audit
WHERE ($1::text IS NULL OR consumer = $1) AND ($2::bigint IS NULL OR request_id = $2) AND ($3::bigint IS NULL OR id < $3)
ORDER BY id DESC LIMIT $4`),
	}
}
