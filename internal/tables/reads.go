package tables

// Reads are the reads of what a consumer's tables hold, for health checks,
// exporters and the dashboard. Parameters: $1 the consumer, where one is
// named.
type Reads struct {
	// LetterCounts counts the open letters by topic and reason, with the
	// age of the oldest of each in seconds; see letterCounts.
	LetterCounts string
	// Kept counts the aggregates and records parked and the processed
	// keys, and the age of the oldest of each in seconds (0 when none).
	Kept string
	// Consumers lists the names of the consumers found in the consumer's
	// tables; see consumers.
	Consumers string
	// Summary reads the dashboard's overview row; see summary.
	Summary string
	// SearchKey finds key $2; see searchKey.
	SearchKey string
	// Chart sums kind $1 of name $2 (NULL: every name) per minute since
	// $3; see chart.
	Chart string
}

// letterCounts counts the open letters by topic and reason, along the
// partial index dead_letters_failure.
const letterCounts = `
SELECT topic, reason, count(*), extract(epoch FROM now() - min(first_failed_at))::float8
FROM {schema}.dead_letters WHERE consumer = $1 AND status = 'dead'
GROUP BY topic, reason ORDER BY topic, reason`

// kept counts the aggregates and records parked and the processed keys
// kept, and the age of the oldest of each.
const kept = `
SELECT (SELECT count(DISTINCT (aggregate_type, aggregate_id)) FROM {schema}.parked WHERE consumer = $1),
       (SELECT count(*) FROM {schema}.parked WHERE consumer = $1),
       coalesce(extract(epoch FROM now() - (SELECT min(parked_at) FROM {schema}.parked WHERE consumer = $1)), 0)::float8,
       (SELECT count(*) FROM {schema}.processed_keys WHERE consumer = $1),
       coalesce(extract(epoch FROM now() - (SELECT min(processed_at) FROM {schema}.processed_keys WHERE consumer = $1)), 0)::float8`

// consumers lists the consumer names found in the consumer's tables.
// Each table is walked a name at a time along an index that starts with
// the consumer (a loose index scan), instead of scanned: a million dead
// letters cost as much as ten.
const consumers = `
WITH RECURSIVE k AS (
    SELECT min(consumer) AS name FROM {schema}.processed_keys
    UNION ALL
    SELECT (SELECT min(consumer) FROM {schema}.processed_keys WHERE consumer > k.name) FROM k WHERE k.name IS NOT NULL
), p AS (
    SELECT min(consumer) AS name FROM {schema}.positions
    UNION ALL
    SELECT (SELECT min(consumer) FROM {schema}.positions WHERE consumer > p.name) FROM p WHERE p.name IS NOT NULL
), d AS (
    SELECT min(consumer) AS name FROM {schema}.dead_letters
    UNION ALL
    SELECT (SELECT min(consumer) FROM {schema}.dead_letters WHERE consumer > d.name) FROM d WHERE d.name IS NOT NULL
), q AS (
    SELECT min(consumer) AS name FROM {schema}.parked
    UNION ALL
    SELECT (SELECT min(consumer) FROM {schema}.parked WHERE consumer > q.name) FROM q WHERE q.name IS NOT NULL
)
SELECT name FROM k WHERE name IS NOT NULL
UNION SELECT name FROM p WHERE name IS NOT NULL
UNION SELECT name FROM d WHERE name IS NOT NULL
UNION SELECT name FROM q WHERE name IS NOT NULL
ORDER BY 1`

// summary reads consumer $1's row of the overview, each count capped
// at $2 rows and each age along an index (dead_letters_open,
// positions_parked, dead_letters_open_age, parked_age): a million open
// letters cost what a few do. consumer.ReadHealth counts exactly, which
// costs a scan, and is for a sampler such as outboxprom.
const summary = `
SELECT (SELECT count(*) FROM (SELECT 1 FROM {schema}.dead_letters WHERE consumer = $1 AND status = 'dead' LIMIT $2) l),
       coalesce(extract(epoch FROM now() - (SELECT min(first_failed_at) FROM {schema}.dead_letters WHERE consumer = $1 AND status = 'dead')), 0)::float8,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.positions WHERE consumer = $1 AND parked > 0 LIMIT $2) g),
       (SELECT coalesce(sum(parked), 0) FROM (SELECT parked FROM {schema}.positions WHERE consumer = $1 AND parked > 0 LIMIT $2) g),
       coalesce(extract(epoch FROM now() - (SELECT min(parked_at) FROM {schema}.parked WHERE consumer = $1)), 0)::float8`

// chart sums kind $1 of name $2 (NULL: every name) per minute since $3.
// It reads the activity table's primary key (kind, name, minute).
const chart = `SELECT minute, sum(n)::bigint FROM {schema}.activity
WHERE kind = $1 AND ($2::text IS NULL OR name = $2) AND minute >= $3
GROUP BY minute ORDER BY minute`

// searchKey finds key $2 of consumer $1 where the tables keep it: its
// claim (processed_keys' primary key) and the records parked with it
// (index parked_key); its letters come through List.
const searchKey = `SELECT (SELECT processed_at FROM {schema}.processed_keys WHERE consumer = $1 AND key = $2),
       ARRAY(SELECT ARRAY[aggregate_type, aggregate_id, seq::text] FROM {schema}.parked WHERE consumer = $1 AND idempotency_key = $2 LIMIT 20)`

func reads(q func(string) string) Reads {
	return Reads{
		LetterCounts: q(letterCounts),
		Kept:         q(kept),
		Consumers:    q(consumers),
		Summary:      q(summary),
		SearchKey:    q(searchKey),
		Chart:        q(chart),
	}
}
