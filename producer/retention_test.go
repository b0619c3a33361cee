package producer_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

func TestPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	event := producer.Event{AggregateType: "order", AggregateID: "o", EventType: "e", Payload: []byte("x")}
	write := func(t *testing.T, db *pgtest.DB, n int) []int64 {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		events := make([]producer.Event, n)
		for i := range events {
			events[i] = event
		}
		written, err := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}).Write(ctx, tx, events...)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		ids := make([]int64, n)
		for i, w := range written {
			ids[i] = w.ID
		}
		return ids
	}
	remaining := func(t *testing.T, db *pgtest.DB) []int64 {
		t.Helper()
		rows, err := db.Pool.Query(ctx, `SELECT id FROM `+db.Table("events")+` ORDER BY id`)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return ids
	}

	t.Run("DeletesOnlyDeliveredRowsPastTheWindow", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		ids := write(t, db, 25)
		// 0-19 created and delivered 10 days ago, but for 3 (never
		// delivered) and 9 (delivered an hour ago, after its retries); 20-21
		// created and delivered just now; 22-24 never delivered.
		_, err := db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET created_at = now() - interval '10 days',
			published_at = CASE WHEN id = $2 THEN NULL WHEN id = $3 THEN now() - interval '1 hour' ELSE now() - interval '10 days' END
			WHERE id <= $1`, ids[19], ids[3], ids[9])
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET published_at = now() WHERE id IN ($1, $2)`, ids[20], ids[21])
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET created_at = now() - interval '30 days' WHERE id > $1`, ids[21])
		require.NoError(t, err)

		res, err := producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema, BatchSize: 7})
		require.NoError(t, err)
		require.Equal(t, int64(18), res.Deleted, "three chunks of seven, the rows kept inside them passed over")
		require.Equal(t, append([]int64{ids[3], ids[9]}, ids[20:]...), remaining(t, db))
	})

	// The walk ends at the first chunk that reaches rows created inside
	// the window, so its cost tracks what is old, not the whole table; a
	// deletable row with a higher id than a young one (a long writer
	// transaction) waits for a later run.
	t.Run("WalkStopsAtTheWindow", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		ids := write(t, db, 5)
		_, err := db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET created_at = now() - interval '10 days', published_at = now() - interval '10 days'
			WHERE id = ANY($1)`, []int64{ids[0], ids[1], ids[2], ids[4]})
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET published_at = now() WHERE id = $1`, ids[3])
		require.NoError(t, err)

		res, err := producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema, BatchSize: 2})
		require.NoError(t, err)
		require.Equal(t, int64(3), res.Deleted)
		require.Equal(t, ids[3:], remaining(t, db))
	})

	t.Run("ForgetsStaleRetryingEntries", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		ids := write(t, db, 3)
		_, err := db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET attempts = 1 WHERE id = ANY($1)`, ids[:2])
		require.NoError(t, err)
		// Left behind: an entry for an event delivered while its trigger
		// was disabled, one for an event that never failed, one for an
		// event that is gone.
		_, err = db.Pool.Exec(ctx, `ALTER TABLE `+db.Table("events")+` DISABLE TRIGGER events_forget_delivered;
			UPDATE `+db.Table("events")+` SET published_at = now() WHERE id = `+strconv.FormatInt(ids[1], 10)+`;
			ALTER TABLE `+db.Table("events")+` ENABLE TRIGGER events_forget_delivered;
			INSERT INTO `+db.Table("retrying_events")+` (id, created_at) SELECT id, created_at FROM `+db.Table("events")+` WHERE id = `+strconv.FormatInt(ids[2], 10)+`;
			INSERT INTO `+db.Table("retrying_events")+` (id, created_at) VALUES (-1, now())`)
		require.NoError(t, err)

		_, err = producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema})
		require.NoError(t, err)
		rows, err := db.Pool.Query(ctx, `SELECT id FROM `+db.Table("retrying_events")+` ORDER BY id`)
		require.NoError(t, err)
		listed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.Equal(t, ids[:1], listed)
	})

	t.Run("DropsOnlyOldPartitionsWithoutUndeliveredRows", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, &pgtest.Opts{PartitionEventsByDay: true})
		// Migrate created a week of partitions, so rows written before the
		// first prune do not land in the default partition.
		res, err := producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema, DaysAhead: 3})
		require.NoError(t, err)
		require.Zero(t, res.PartitionsCreated)
		res, err = producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema, DaysAhead: 9})
		require.NoError(t, err)
		require.Equal(t, 2, res.PartitionsCreated, "days 8 and 9 ahead")

		// Two old days: one fully delivered, one holding an undelivered row.
		day := func(ago int) time.Time {
			return time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -ago)
		}
		for _, ago := range []int{20, 21} {
			name := "events_p" + day(ago).Format("20060102")
			_, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Table(name)+` PARTITION OF `+db.Table("events")+
				` FOR VALUES FROM ('`+day(ago).Format(time.RFC3339)+`') TO ('`+day(ago-1).Format(time.RFC3339)+`')`)
			require.NoError(t, err)
		}
		ids := write(t, db, 3)
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET created_at = $2, published_at = CASE WHEN id = $3 THEN NULL ELSE now() END WHERE id = ANY($1)`,
			ids[:2], day(21).Add(time.Hour), ids[1])
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET created_at = $2, published_at = now() WHERE id = $1`, ids[2], day(20).Add(time.Hour))
		require.NoError(t, err)

		var inDefault int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("events_default")).Scan(&inDefault))
		require.Zero(t, inDefault)

		res, err = producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema, DaysAhead: 3})
		require.NoError(t, err)
		require.Equal(t, 1, res.PartitionsDropped)
		require.Zero(t, res.PartitionsCreated)
		var exists20, exists21 bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
			db.Table("events_p"+day(20).Format("20060102")), db.Table("events_p"+day(21).Format("20060102"))).Scan(&exists20, &exists21))
		require.False(t, exists20, "the delivered day is dropped")
		require.True(t, exists21, "the day with an undelivered event stays")
		require.Equal(t, ids[:2], remaining(t, db))
	})

	t.Run("DefaultPartitionRowsArePrunedAndItsDaysSkipped", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, &pgtest.Opts{PartitionEventsByDay: true})
		// A day nobody created a partition for: its rows go to the default
		// partition, and creating that day later must not fail.
		far := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, 12).Add(time.Hour)
		old := time.Now().UTC().AddDate(0, 0, -30)
		ids := write(t, db, 3)
		_, err := db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET created_at = $2 WHERE id = $1`, ids[0], far)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET created_at = $2, published_at = $2 WHERE id = ANY($1)`, ids[1:], old)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET published_at = NULL WHERE id = $1`, ids[2])
		require.NoError(t, err)

		res, err := producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema, DaysAhead: 14})
		require.NoError(t, err)
		require.Equal(t, 6, res.PartitionsCreated, "days 8 to 14 ahead, less the one with default rows")
		require.Equal(t, int64(1), res.Deleted, "the delivered old row in the default partition")
		require.Equal(t, []int64{ids[0], ids[2]}, remaining(t, db))
	})

	t.Run("RefusesNegativeRetention", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		_, err := producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema, Retention: -time.Hour})
		require.ErrorContains(t, err, "must not be negative")
	})
}
