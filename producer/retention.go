package producer

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
)

// PruneConfig tunes Prune. The zero value is valid.
type PruneConfig struct {
	// Schema holds the outbox tables. Default outbox.DefaultSchema.
	Schema string
	// Retention is how long delivered events are kept. Default 7 days.
	Retention time.Duration
	// BatchSize bounds each DELETE so that no statement holds many locks or
	// produces a burst of WAL. Default 10000.
	BatchSize int
	// DaysAhead is how many days of partitions to keep created ahead, for
	// a day-partitioned events table. Default 7.
	DaysAhead int
}

// PruneResult says what Prune removed.
type PruneResult struct {
	// Deleted counts rows deleted from a plain events table.
	Deleted int64
	// PartitionsCreated and PartitionsDropped count day partitions.
	PartitionsCreated, PartitionsDropped int
}

// Prune removes delivered events older than the retention window. An
// undelivered event is never removed, whatever its age. In CDC mode
// (SetDispatch) every event is written as delivered, so Prune removes
// events by age alone: the connector reads them from the WAL, which the
// slot retains whether the rows are still there or not.
//
// On a plain events table it deletes in batches until none is left. On a
// day-partitioned table (MigrateConfig.PartitionEventsByDay) it creates the
// coming days' partitions and drops whole partitions that ended before the
// window and hold no undelivered event. It also forgets the entries of
// retrying_events whose event is no longer owed (see the baseline migration). A
// Relay calls it every [RelayConfig.RetentionInterval]; call it yourself only
// when running without a relay or with retention disabled there.
func Prune(ctx context.Context, db outbox.DB, cfg *PruneConfig) (PruneResult, error) {
	c := PruneConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = outbox.DefaultSchema
	}
	if c.Retention < 0 || c.BatchSize < 0 || c.DaysAhead < 0 {
		return PruneResult{}, fmt.Errorf("producer: prune: Retention (%s), BatchSize (%d) and DaysAhead (%d) must not be negative", c.Retention, c.BatchSize, c.DaysAhead)
	}
	setDefault(&c.Retention, 7*24*time.Hour)
	setDefault(&c.BatchSize, 10000)
	setDefault(&c.DaysAhead, 7)
	var res PruneResult
	var partitioned bool
	sql := tables.ProducerFor(c.Schema).Retention
	err := db.QueryRow(ctx, sql.Partitioned, c.Schema).Scan(&partitioned)
	if err != nil {
		return res, fmt.Errorf("producer: prune: find events table in schema %q (%s): %w", c.Schema, migrateHint(err), err)
	}
	cutoff := time.Now().Add(-c.Retention)
	stmt := sql.PruneEvents
	if partitioned {
		if err := db.QueryRow(ctx, sql.CreatePartitions, c.DaysAhead).Scan(&res.PartitionsCreated); err != nil {
			return res, fmt.Errorf("producer: prune: create partitions: %w", err)
		}
		if err := db.QueryRow(ctx, sql.DropPartitions, cutoff).Scan(&res.PartitionsDropped); err != nil {
			return res, fmt.Errorf("producer: prune: drop partitions: %w", err)
		}
		// Rows that landed in the default partition are deleted row by row.
		stmt = sql.PruneDefault
	}
	if _, err := db.Exec(ctx, sql.ForgetStaleRetrying); err != nil {
		return res, fmt.Errorf("producer: prune: forget stale retrying events: %w", err)
	}
	from := int64(math.MinInt64)
	for {
		var (
			last, scanned, deleted int64
			reachedWindow          bool
		)
		if err := db.QueryRow(ctx, stmt, from, c.BatchSize, cutoff).Scan(&last, &scanned, &reachedWindow, &deleted); err != nil {
			return res, fmt.Errorf("producer: prune: delete delivered events: %w", err)
		}
		res.Deleted += deleted
		if scanned < int64(c.BatchSize) || reachedWindow {
			return res, nil
		}
		from = last
	}
}

// RunPrune calls Prune every interval (default 1m) until ctx ends, and
// then returns nil. Errors are logged to logger (default slog.Default())
// and retried at the next interval. A Relay prunes by itself; run this
// where no relay runs, as in CDC mode (SetDispatch), where it also creates
// the coming days' partitions of a day-partitioned table: without it,
// writes land in the default partition and nothing is ever removed.
func RunPrune(ctx context.Context, db outbox.DB, interval time.Duration, cfg *PruneConfig, logger *slog.Logger) error {
	if interval <= 0 {
		interval = time.Minute
	}
	if logger == nil {
		logger = slog.Default()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := Prune(ctx, db, cfg)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			logger.WarnContext(ctx, "producer: prune events, will retry", slog.String("error", err.Error()))
		case res != (PruneResult{}):
			logger.InfoContext(ctx, "producer: pruned events", slog.Int64("deleted", res.Deleted),
				slog.Int("partitions_created", res.PartitionsCreated), slog.Int("partitions_dropped", res.PartitionsDropped))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
