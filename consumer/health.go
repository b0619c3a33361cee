package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/d419a114/outbox/deadletter"
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

// Health reads the health of consumer. It counts rows, so sample it at a
// low rate (once a minute, say), not per scrape of a busy exporter.
func (in *Inspector) Health(ctx context.Context, consumer string) (Health, error) {
	var h Health
	sql := in.sql.Reads
	rows, err := in.db.Query(ctx, sql.LetterCounts, consumer)
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
	if err := in.db.QueryRow(ctx, sql.Kept, consumer).
		Scan(&h.ParkedAggregates, &h.ParkedRecords, &gap, &h.ProcessedKeys, &key); err != nil {
		return Health{}, fmt.Errorf("consumer: read health: %w", err)
	}
	h.OldestGap, h.OldestKey = seconds(gap), seconds(key)
	return h, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
