package producer

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

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

// pruneChunkSQL deletes the delivered rows, published before the cutoff
// ($3), among the next chunk of rows in id order after $1, and returns the
// chunk's last id, its size, whether it reached a row created inside the
// window, and how many rows it deleted.
//
// Retention walks the primary key rather than an index on published_at,
// which every write would pay for (see the baseline migration). Rows are created
// in roughly id order and published after they are created, so the walk
// can stop at the first chunk that reaches the window: the rows after it
// were created too recently to be deletable. A row created before the
// cutoff but given a higher id (by a long writer transaction) is left to a
// later run, once the walk gets that far. Each chunk reads its rows by key
// range, and the DELETE finds its rows by key too, whatever the statistics
// say about the table; a concurrent prune of the same rows makes it wait
// for that one's statement and then skip them.
const pruneChunkSQL = `
WITH chunk AS MATERIALIZED (
    SELECT id, created_at, published_at
    FROM {schema}.{table}
    WHERE id > $1
    ORDER BY id
    LIMIT $2
), gone AS (
    DELETE FROM {schema}.{table}
    WHERE id = ANY (ARRAY(SELECT id FROM chunk WHERE published_at < $3))
      AND published_at < $3
    RETURNING 1
)
SELECT coalesce(max(id), 0), count(*), coalesce(bool_or(created_at >= $3), false), (SELECT count(*) FROM gone)
FROM chunk`

// forgetStaleRetryingSQL removes the entries of retrying_events whose
// event is no longer owed after a failure: left by hand, or while a trigger
// was disabled. They hold nothing back (the claim checks each entry again)
// but cost every claim a lookup. Each entry is looked up on its own (the
// LATERAL with LIMIT 1), so that a long list never turns into a scan of
// events. A failure being recorded meanwhile is not visible to this
// statement, nor is its entry, which it therefore leaves alone.
const forgetStaleRetryingSQL = `
DELETE FROM {schema}.retrying_events d
USING {schema}.retrying_events r
LEFT JOIN LATERAL (
    SELECT true AS owed FROM {schema}.events e
    WHERE e.id = r.id AND e.created_at = r.created_at AND e.published_at IS NULL AND e.attempts > 0
    LIMIT 1) x ON true
WHERE d.id = r.id AND x.owed IS NULL`

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
// Relay calls it every RelayConfig.RetentionInterval; call it yourself only
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
	err := db.QueryRow(ctx, `SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)`,
		qualify("{schema}.events", c.Schema)).Scan(&partitioned)
	if err != nil {
		return res, fmt.Errorf("producer: prune: find events table in schema %q (%s): %w", c.Schema, migrateHint(err), err)
	}
	cutoff := time.Now().Add(-c.Retention)
	table := "events"
	if partitioned {
		if err := db.QueryRow(ctx, qualify(`SELECT {schema}.create_event_partitions($1)`, c.Schema), c.DaysAhead).Scan(&res.PartitionsCreated); err != nil {
			return res, fmt.Errorf("producer: prune: create partitions: %w", err)
		}
		if err := db.QueryRow(ctx, qualify(`SELECT {schema}.drop_event_partitions($1)`, c.Schema), cutoff).Scan(&res.PartitionsDropped); err != nil {
			return res, fmt.Errorf("producer: prune: drop partitions: %w", err)
		}
		// Rows that landed in the default partition are deleted row by row.
		table = "events_default"
	}
	if _, err := db.Exec(ctx, qualify(forgetStaleRetryingSQL, c.Schema)); err != nil {
		return res, fmt.Errorf("producer: prune: forget stale retrying events: %w", err)
	}
	stmt := tables.Fill(pruneChunkSQL, c.Schema, "{table}", pgx.Identifier{table}.Sanitize())
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
