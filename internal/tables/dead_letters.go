package tables

// DeadLetterColumns are the columns Get, GetForUpdate and List return, in
// order.
const DeadLetterColumns = `id, consumer, topic, kafka_partition, kafka_offset, record_key, value, header_keys, header_values,
    record_time, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, error, stack, attempts,
    first_failed_at, last_failed_at, status, resolved_at`

// DeadLetters are the statements on dead_letters, the records a consumer
// gave up on.
type DeadLetters struct {
	// Put stores a letter ($1 consumer, $2 topic, $3 partition, $4 offset,
	// $5 key, $6 value, $7 and $8 header keys and values, $9 timestamp,
	// $10 idempotency key, $11 to $13 aggregate type, id and sequence, $14
	// error, $15 stack, $16 attempts) and returns its id. The record's
	// fingerprint is part of the unique key, so that a redelivered failure
	// updates its letter and a different record at the same offset gets its
	// own. The WHERE keeps a resolved letter as it is: no row comes back for
	// it.
	Put string
	// Get reads letter $1.
	Get string
	// GetForUpdate reads letter $1 and locks it: a second replay of the same
	// letter waits there and then finds it resolved.
	GetForUpdate string
	// List reads up to $7 letters with ids above $6, lowest first, filtered
	// by consumer $1, topic $2, status $3, aggregate type $4 and id $5 where
	// those are not NULL.
	List string
	// SetStatus sets letter $1's status to $2 and stamps resolved_at.
	SetStatus string
	// Holds says whether an open letter of consumer $1's aggregate ($2, $3)
	// lies strictly between sequences $4 and $5. Served by the partial index
	// dead_letters_open.
	Holds string
}

func deadLetters(q func(string) string) DeadLetters {
	return DeadLetters{
		Put: q(`INSERT INTO {schema}.dead_letters AS d (consumer, topic, kafka_partition, kafka_offset, record_key, value,
    header_keys, header_values, record_time, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, error, stack, attempts,
    fingerprint)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, {schema}.record_fingerprint($5, $6, $7, $8))
ON CONFLICT (consumer, topic, kafka_partition, kafka_offset, fingerprint) DO UPDATE
SET attempts = d.attempts + EXCLUDED.attempts, error = EXCLUDED.error, stack = EXCLUDED.stack, last_failed_at = now()
WHERE d.status = 'dead'
RETURNING id`),
		Get:          q(`SELECT ` + DeadLetterColumns + ` FROM {schema}.dead_letters WHERE id = $1`),
		GetForUpdate: q(`SELECT ` + DeadLetterColumns + ` FROM {schema}.dead_letters WHERE id = $1 FOR UPDATE`),
		List: q(`SELECT ` + DeadLetterColumns + ` FROM {schema}.dead_letters
WHERE ($1::text IS NULL OR consumer = $1) AND ($2::text IS NULL OR topic = $2) AND ($3::text IS NULL OR status = $3)
  AND ($4::text IS NULL OR aggregate_type = $4) AND ($5::text IS NULL OR aggregate_id = $5) AND id > $6
ORDER BY id LIMIT $7`),
		SetStatus: q(`UPDATE {schema}.dead_letters SET status = $2, resolved_at = now() WHERE id = $1`),
		Holds: q(`SELECT EXISTS (SELECT 1 FROM {schema}.dead_letters
    WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND status = 'dead' AND aggregate_seq > $4 AND aggregate_seq < $5)`),
	}
}
