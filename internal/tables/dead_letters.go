package tables

// DeadLetterColumns are the columns Get, GetForUpdate and List return, in
// order.
const DeadLetterColumns = `id, consumer, topic, kafka_partition, kafka_offset, record_key, value, header_keys, header_values,
    record_time, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, error, stack, attempts,
    first_failed_at, last_failed_at, status, resolved_at, reason, failure, coalesce(octet_length(value), 0) AS value_size, history`

// DeadLetterBriefColumns are DeadLetterColumns as a brief listing reads
// them: 256 bytes of the key, the value and the error (enough to recognise
// a record, and a bound on a page whatever the records hold), no headers,
// stack or history, and value_size, the value's whole length.
const DeadLetterBriefColumns = `id, consumer, topic, kafka_partition, kafka_offset,
    substring(record_key for 256) AS record_key, substring(value for 256) AS value,
    NULL::text[] AS header_keys, NULL::bytea[] AS header_values,
    record_time, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, left(error, 256) AS error, NULL::text AS stack, attempts,
    first_failed_at, last_failed_at, status, resolved_at, reason, failure, coalesce(octet_length(value), 0) AS value_size,
    '[]'::jsonb AS history`

// DeadLetterPeekColumns are DeadLetterColumns as Peek reads them: 64 KiB
// of the key, the value, the stack and each of the first 100 headers, and
// 16,384 characters of the error: enough to read a record, and a bound on
// one letter's page whatever the record holds.
const DeadLetterPeekColumns = `id, consumer, topic, kafka_partition, kafka_offset,
    substring(record_key for 65536) AS record_key, substring(value for 65536) AS value,
    header_keys[1:100] AS header_keys,
    ARRAY(SELECT substring(v for 65536) FROM unnest(header_values[1:100]) WITH ORDINALITY AS h (v, n) ORDER BY n) AS header_values,
    record_time, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, left(error, 16384) AS error, left(stack, 65536) AS stack, attempts,
    first_failed_at, last_failed_at, status, resolved_at, reason, failure, coalesce(octet_length(value), 0) AS value_size, history`

// deadLetterFilter is the WHERE of List, Match and Preview: consumer $1,
// topic $2, status $3, aggregate type $4 and id $5, reason $6, failure $7,
// first failed at or after $8 and before $9, idempotency key $10, where
// those are not NULL.
const deadLetterFilter = `($1::text IS NULL OR consumer = $1) AND ($2::text IS NULL OR topic = $2) AND ($3::text IS NULL OR status = $3)
  AND ($4::text IS NULL OR aggregate_type = $4) AND ($5::text IS NULL OR aggregate_id = $5)
  AND ($6::text IS NULL OR reason = $6) AND ($7::text IS NULL OR failure = $7)
  AND ($8::timestamptz IS NULL OR first_failed_at >= $8) AND ($9::timestamptz IS NULL OR first_failed_at < $9)
  AND ($10::text IS NULL OR idempotency_key = $10)`

// DeadLetters are the statements on dead_letters, the records a consumer
// gave up on.
type DeadLetters struct {
	// Put stores a letter ($1 consumer, $2 topic, $3 partition, $4 offset,
	// $5 key, $6 value, $7 and $8 header keys and values, $9 timestamp,
	// $10 idempotency key, $11 to $13 aggregate type, id and sequence, $14
	// error, $15 stack, $16 attempts, $17 reason, $18 failure) and returns
	// its id. The record's
	// fingerprint is part of the unique key, so that a redelivered failure
	// updates its letter and a different record at the same offset gets its
	// own. The WHERE keeps a resolved letter as it is: no row comes back for
	// it.
	Put string
	// Get reads letter $1.
	Get string
	// Peek reads letter $1 as DeadLetterPeekColumns bounds it.
	Peek string
	// GetForUpdate reads letter $1 and locks it: a second replay of the same
	// letter waits there and then finds it resolved.
	GetForUpdate string
	// List reads up to $12 letters with ids above $11, lowest first,
	// filtered as deadLetterFilter says.
	List string
	// ListBrief is List reading DeadLetterBriefColumns.
	ListBrief string
	// Match reads the id, aggregate and sequence of up to $11 letters
	// filtered as deadLetterFilter says, in the order an operator acts on
	// them: by aggregate, each aggregate's in sequence order, the
	// unsequenced ones last.
	Match string
	// Preview counts, of the letters filtered as deadLetterFilter says, up
	// to $11 letters, their distinct aggregates, and the records parked
	// behind those aggregates.
	Preview string
	// Failures groups consumer $1's newest $3 open letters by failure: up
	// to $2 groups, largest first, each with its reason, count, oldest and
	// newest failure and lowest letter id. Reading the newest along the
	// primary key bounds it; grouping all of a million took 0.7 s.
	Failures string
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
    fingerprint, reason, failure, history)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, {schema}.record_fingerprint($5, $6, $7, $8), $17, $18,
    jsonb_build_array(jsonb_build_object('at', now(), 'attempts', $16::integer, 'error', left($14, 1024))))
ON CONFLICT (consumer, topic, kafka_partition, kafka_offset, fingerprint) DO UPDATE
SET attempts = d.attempts + EXCLUDED.attempts, error = EXCLUDED.error, stack = EXCLUDED.stack, last_failed_at = now(),
    reason = EXCLUDED.reason, failure = EXCLUDED.failure,
    history = CASE WHEN jsonb_array_length(d.history) >= 20 THEN d.history - 0 ELSE d.history END || EXCLUDED.history
WHERE d.status = 'dead'
RETURNING id`),
		Get:          q(`SELECT ` + DeadLetterColumns + ` FROM {schema}.dead_letters WHERE id = $1`),
		Peek:         q(`SELECT ` + DeadLetterPeekColumns + ` FROM {schema}.dead_letters WHERE id = $1`),
		GetForUpdate: q(`SELECT ` + DeadLetterColumns + ` FROM {schema}.dead_letters WHERE id = $1 FOR UPDATE`),
		List: q(`SELECT ` + DeadLetterColumns + ` FROM {schema}.dead_letters
WHERE ` + deadLetterFilter + ` AND id > $11
ORDER BY id LIMIT $12`),
		ListBrief: q(`SELECT ` + DeadLetterBriefColumns + ` FROM {schema}.dead_letters
WHERE ` + deadLetterFilter + ` AND id > $11
ORDER BY id LIMIT $12`),
		Match: q(`SELECT id, coalesce(aggregate_type, ''), coalesce(aggregate_id, ''), coalesce(aggregate_seq, 0) FROM {schema}.dead_letters
WHERE ` + deadLetterFilter + `
ORDER BY aggregate_seq IS NULL, aggregate_type, aggregate_id, aggregate_seq, id LIMIT $11`),
		Preview: q(`WITH m AS (SELECT consumer, aggregate_type, aggregate_id FROM {schema}.dead_letters WHERE ` + deadLetterFilter + ` LIMIT $11),
a AS (SELECT DISTINCT consumer, aggregate_type, aggregate_id FROM m WHERE aggregate_id IS NOT NULL)
SELECT (SELECT count(*) FROM m), (SELECT count(*) FROM a),
       (SELECT count(*) FROM {schema}.parked p JOIN a USING (consumer, aggregate_type, aggregate_id))`),
		Failures: q(`SELECT failure, min(reason), count(*), min(first_failed_at), max(last_failed_at), min(id)
FROM (SELECT failure, reason, first_failed_at, last_failed_at, id FROM {schema}.dead_letters
      WHERE consumer = $1 AND status = 'dead' ORDER BY id DESC LIMIT $3) AS newest
GROUP BY failure ORDER BY count(*) DESC, failure LIMIT $2`),
		SetStatus: q(`UPDATE {schema}.dead_letters SET status = $2, resolved_at = now() WHERE id = $1`),
		Holds: q(`SELECT EXISTS (SELECT 1 FROM {schema}.dead_letters
    WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND status = 'dead' AND aggregate_seq > $4 AND aggregate_seq < $5)`),
	}
}
