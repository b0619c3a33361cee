package tables

import (
	"crypto/sha256"
	"encoding/hex"
)

// requestColumns are the columns every statement that reads requests
// returns, in the order operator.Store scans them.
const requestColumns = `id, consumer, action, letter_id, topic, aggregate_type, aggregate_id, reason, failure, failed_after,
    failed_before, rate, requested_by, requested_at, status, started_at, finished_at,
    matched, applied, duplicates, discarded, failed, skipped, drained, error, claim`

// Operator holds the statements of the operator tables, operator_requests
// and operator_audit, in one schema.
type Operator struct {
	// Submit inserts a pending request and returns its id.
	Submit string
	// Get reads request $1.
	Get string
	// List reads up to $4 requests newest first, filtered by consumer $1,
	// status $2 and id below $3 where those are not NULL.
	List string
	// Claim takes up consumer $1's oldest open request whose lease (if
	// any) ran out, under a lease of $2 seconds, and raises its claim;
	// SKIP LOCKED keeps two processes from claiming one (and skips a
	// request whose action is committing its count: the next poll takes
	// it).
	Claim string
	// The fenced writes of the process holding claim $2 of request $1.
	// Each touches no row once another process has claimed the request
	// (claim moved on) or, but for finish, once it was cancelled.
	//
	// Renew renews the lease for $3 seconds.
	Renew string
	// Count adds to the counts of what was done, in the transaction of
	// the action counted, and returns the sums. Its row lock, held until
	// that transaction ends, is why it comes last in the action.
	Count string
	// Report writes the run's counts and error and renews the lease for
	// $3 seconds.
	Report string
	// Finish writes the run's counts and error and ends the request with
	// status $3, or leaves it cancelled; it returns what is stored.
	Finish string
	// Fence reads why a fenced write touched nothing.
	Fence string
	// LockStatus reads request $1's status, locking its row for cancel.
	LockStatus string
	// Cancel ends request $1 as cancelled.
	Cancel string
	// Record inserts an audit row.
	Record string
	// Audit reads up to $4 audit rows newest first, filtered by consumer
	// $1, request $2 and id below $3 where those are not NULL.
	Audit string
	// Notify tells channel $1 (OperatorChannel) that consumer $2 has a
	// request waiting; it is sent when the transaction commits.
	Notify string
	// Listen listens on the schema's OperatorChannel.
	Listen string
}

// OperatorChannel is the LISTEN/NOTIFY channel on which a request's
// submitter tells a schema's consumers that a request is waiting; the
// payload is the consumer's name. It is a hash of the schema: lower-case
// letters, digits and underscores, safe as an identifier.
func OperatorChannel(schema string) string {
	sum := sha256.Sum256([]byte(schema))
	return "outbox_op_" + hex.EncodeToString(sum[:])[:16]
}

// OperatorFor returns the operator tables' statements with schema written
// in, quoted.
func OperatorFor(schema string) *Operator {
	q := func(sql string) string { return Fill(sql, schema) }
	run := `matched = $4, failed = $5, skipped = $6, error = $7`
	fenced := ` WHERE id = $1 AND claim = $2 AND status = 'running'`
	return &Operator{
		Submit: q(`INSERT INTO {schema}.operator_requests (consumer, action, letter_id, topic, aggregate_type, aggregate_id,
    reason, failure, failed_after, failed_before, rate, requested_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id`),
		Get: q(`SELECT ` + requestColumns + ` FROM {schema}.operator_requests WHERE id = $1`),
		List: q(`SELECT ` + requestColumns + ` FROM {schema}.operator_requests
WHERE ($1::text IS NULL OR consumer = $1) AND ($2::text IS NULL OR status = $2) AND ($3::bigint IS NULL OR id < $3)
ORDER BY id DESC LIMIT $4`),
		Claim: q(`UPDATE {schema}.operator_requests
SET status = 'running', lease_until = now() + make_interval(secs => $2), started_at = coalesce(started_at, now()), claim = claim + 1
WHERE id = (SELECT id FROM {schema}.operator_requests
            WHERE consumer = $1 AND (status = 'pending' OR (status = 'running' AND lease_until < now()))
            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING ` + requestColumns),
		Renew: q(`UPDATE {schema}.operator_requests SET lease_until = now() + make_interval(secs => $3)` + fenced),
		Count: q(`UPDATE {schema}.operator_requests
SET applied = applied + $3, duplicates = duplicates + $4, discarded = discarded + $5, drained = drained + $6` + fenced + `
RETURNING applied, duplicates, discarded, drained`),
		Report: q(`UPDATE {schema}.operator_requests SET lease_until = now() + make_interval(secs => $3), ` + run + fenced),
		Finish: q(`UPDATE {schema}.operator_requests
SET status = CASE WHEN status = 'cancelled' THEN status ELSE $3 END, finished_at = coalesce(finished_at, now()), lease_until = NULL, ` + run + `
WHERE id = $1 AND claim = $2 AND status IN ('running', 'cancelled')
RETURNING status, applied, duplicates, discarded, drained`),
		Fence:      q(`SELECT status, claim FROM {schema}.operator_requests WHERE id = $1`),
		LockStatus: q(`SELECT status FROM {schema}.operator_requests WHERE id = $1 FOR UPDATE`),
		Cancel: q(`UPDATE {schema}.operator_requests SET status = 'cancelled', finished_at = now(), lease_until = NULL WHERE id = $1
RETURNING ` + requestColumns),
		Record: q(`INSERT INTO {schema}.operator_audit (actor, consumer, action, request_id, letter_id, aggregate_type, aggregate_id, outcome, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`),
		Audit: q(`SELECT id, at, actor, consumer, action, request_id, letter_id, aggregate_type, aggregate_id, outcome, detail
FROM {schema}.operator_audit
WHERE ($1::text IS NULL OR consumer = $1) AND ($2::bigint IS NULL OR request_id = $2) AND ($3::bigint IS NULL OR id < $3)
ORDER BY id DESC LIMIT $4`),
		Notify: `SELECT pg_notify($1, $2)`,
		Listen: "LISTEN " + OperatorChannel(schema),
	}
}
