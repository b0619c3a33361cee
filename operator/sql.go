package operator

import "github.com/d419a114/outbox/internal/tables"

// requestColumns are the columns every statement that reads requests
// returns, in the order Store.query scans them.
const requestColumns = `id, consumer, action, letter_id, topic, aggregate_type, aggregate_id, reason, failure, failed_after,
    failed_before, rate, requested_by, requested_at, status, started_at, finished_at,
    matched, applied, duplicates, discarded, failed, skipped, drained, error`

// statements are the operator tables' statements in one schema.
type statements struct {
	// submit inserts a pending request and returns its id.
	submit string
	get    string
	// list reads up to $4 requests newest first, filtered by consumer $1,
	// status $2 and id below $3 where those are not NULL.
	list string
	// claim takes up consumer $1's oldest open request whose lease (if
	// any) ran out, under a lease of $2 seconds; SKIP LOCKED keeps two
	// processes from claiming one.
	claim string
	// report writes request $1's progress and renews its lease for $2
	// seconds.
	report string
	// finish writes request $1's progress and its end, status $2.
	finish string
	// record inserts an audit row.
	record string
	// audit reads up to $4 audit rows newest first, filtered by consumer
	// $1, request $2 and id below $3 where those are not NULL.
	audit string
}

func statementsFor(schema string) statements {
	q := func(sql string) string { return tables.Fill(sql, schema) }
	progress := `matched = $3, applied = $4, duplicates = $5, discarded = $6, failed = $7, skipped = $8, drained = $9, error = $10`
	return statements{
		submit: q(`INSERT INTO {schema}.operator_requests (consumer, action, letter_id, topic, aggregate_type, aggregate_id,
    reason, failure, failed_after, failed_before, rate, requested_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id`),
		get: q(`SELECT ` + requestColumns + ` FROM {schema}.operator_requests WHERE id = $1`),
		list: q(`SELECT ` + requestColumns + ` FROM {schema}.operator_requests
WHERE ($1::text IS NULL OR consumer = $1) AND ($2::text IS NULL OR status = $2) AND ($3::bigint IS NULL OR id < $3)
ORDER BY id DESC LIMIT $4`),
		claim: q(`UPDATE {schema}.operator_requests
SET status = 'running', lease_until = now() + make_interval(secs => $2), started_at = coalesce(started_at, now())
WHERE id = (SELECT id FROM {schema}.operator_requests
            WHERE consumer = $1 AND (status = 'pending' OR (status = 'running' AND lease_until < now()))
            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING ` + requestColumns),
		report: q(`UPDATE {schema}.operator_requests SET lease_until = now() + make_interval(secs => $2), ` + progress + ` WHERE id = $1`),
		finish: q(`UPDATE {schema}.operator_requests SET status = $2, finished_at = now(), lease_until = NULL, ` + progress + ` WHERE id = $1`),
		record: q(`INSERT INTO {schema}.operator_audit (actor, consumer, action, request_id, letter_id, aggregate_type, aggregate_id, outcome, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`),
		audit: q(`SELECT id, at, actor, consumer, action, request_id, letter_id, aggregate_type, aggregate_id, outcome, detail
FROM {schema}.operator_audit
WHERE ($1::text IS NULL OR consumer = $1) AND ($2::bigint IS NULL OR request_id = $2) AND ($3::bigint IS NULL OR id < $3)
ORDER BY id DESC LIMIT $4`),
	}
}
