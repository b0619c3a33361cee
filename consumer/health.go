package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/tables"
)

// Health is what a consumer has set aside or kept, read from its tables,
// for dashboards and alerts. Alert on any open dead letter and on OldestGap
// growing (a record parked behind a gap that does not fill); compare
// OldestKey with the topics' retention: a record redelivered after its key
// was pruned is applied again.
type Health struct {
	// Letters counts the open dead letters by topic and reason.
	Letters []LetterCount
	// ParkedAggregates counts the aggregates with records parked behind a
	// gap or a dead letter, ParkedRecords those records.
	ParkedAggregates, ParkedRecords int64
	// OldestGap is how long the oldest parked record has waited; zero when
	// none is parked.
	OldestGap time.Duration
	// ProcessedKeys counts the processed keys kept for dedupe; OldestKey is
	// the age of the oldest, zero when there is none.
	ProcessedKeys int64
	OldestKey     time.Duration
}

// LetterCount is how many open dead letters of a topic have one reason,
// and how long the oldest has been open.
type LetterCount struct {
	Topic string
	// Reason is the class of the letters' failure, one of
	// deadletter.Reasons.
	Reason deadletter.Reason
	Count  int64
	Oldest time.Duration
}

// readHealthSQL counts the open letters by topic and reason, along the
// partial index dead_letters_failure.
const readHealthSQL = `
SELECT topic, reason, count(*), extract(epoch FROM now() - min(first_failed_at))::float8
FROM {schema}.dead_letters WHERE consumer = $1 AND status = 'dead'
GROUP BY topic, reason ORDER BY topic, reason`

const readKeptSQL = `
SELECT (SELECT count(DISTINCT (aggregate_type, aggregate_id)) FROM {schema}.parked WHERE consumer = $1),
       (SELECT count(*) FROM {schema}.parked WHERE consumer = $1),
       coalesce(extract(epoch FROM now() - (SELECT min(parked_at) FROM {schema}.parked WHERE consumer = $1)), 0)::float8,
       (SELECT count(*) FROM {schema}.processed_keys WHERE consumer = $1),
       coalesce(extract(epoch FROM now() - (SELECT min(processed_at) FROM {schema}.processed_keys WHERE consumer = $1)), 0)::float8`

// consumersSQL lists the consumer names found in the consumer's tables.
// Each table is walked a name at a time along an index that starts with
// the consumer (a loose index scan), instead of scanned: a million dead
// letters cost as much as ten.
const consumersSQL = `
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

// Consumers returns the names of the consumers that have kept anything in
// schema ("" means outbox.DefaultSchema): processed keys, positions, dead
// letters or parked records.
func Consumers(ctx context.Context, db DB, schema string) ([]string, error) {
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	rows, err := db.Query(ctx, tables.Fill(consumersSQL, schema))
	if err != nil {
		return nil, fmt.Errorf("consumer: list consumers: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("consumer: list consumers: %w", err)
	}
	return names, nil
}

// ReadHealth reads the health of the consumer name in schema ("" means
// outbox.DefaultSchema). It counts rows, so sample it at a low rate (once
// a minute, say), not per scrape of a busy exporter.
func ReadHealth(ctx context.Context, db DB, schema, name string) (Health, error) {
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	var h Health
	rows, err := db.Query(ctx, tables.Fill(readHealthSQL, schema), name)
	if err != nil {
		return Health{}, fmt.Errorf("consumer: read health: %w", err)
	}
	for rows.Next() {
		var (
			l      LetterCount
			oldest float64
		)
		if err := rows.Scan(&l.Topic, &l.Reason, &l.Count, &oldest); err != nil {
			rows.Close()
			return Health{}, fmt.Errorf("consumer: read health: %w", err)
		}
		l.Oldest = seconds(oldest)
		h.Letters = append(h.Letters, l)
	}
	if err := rows.Err(); err != nil {
		return Health{}, fmt.Errorf("consumer: read health: %w", err)
	}
	var gap, key float64
	if err := db.QueryRow(ctx, tables.Fill(readKeptSQL, schema), name).
		Scan(&h.ParkedAggregates, &h.ParkedRecords, &gap, &h.ProcessedKeys, &key); err != nil {
		return Health{}, fmt.Errorf("consumer: read health: %w", err)
	}
	h.OldestGap, h.OldestKey = seconds(gap), seconds(key)
	return h, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
