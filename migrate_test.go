package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMigrate(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) (*pgxpool.Pool, string) {
		t.Helper()
		srv, err := pgtest.Shared()
		require.NoError(t, err)
		pool, err := pgxpool.New(context.Background(), srv.URL)
		require.NoError(t, err)
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		schema := "migrate_" + hex.EncodeToString(b)
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			require.NoError(t, err)
			pool.Close()
		})
		return pool, schema
	}

	t.Run("SecondRunIsNoOp", func(t *testing.T) {
		t.Parallel()
		pool, schema := setup(t)
		ctx := context.Background()
		list, err := outbox.MigrationList()
		require.NoError(t, err)
		applied, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema})
		require.NoError(t, err)
		require.Len(t, applied, len(list))
		applied, err = outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema})
		require.NoError(t, err)
		require.Empty(t, applied)
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "schema_versions"}.Sanitize()).Scan(&n))
		require.Equal(t, len(list), n)
	})

	t.Run("ConcurrentRunsApplyOnce", func(t *testing.T) {
		t.Parallel()
		pool, schema := setup(t)
		ctx := context.Background()
		const runs = 4
		results := make(chan []int, runs)
		errs := make(chan error, runs)
		for range runs {
			go func() {
				applied, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema})
				errs <- err
				results <- applied
			}()
		}
		total := 0
		for range runs {
			require.NoError(t, <-errs)
			total += len(<-results)
		}
		list, err := outbox.MigrationList()
		require.NoError(t, err)
		require.Equal(t, len(list), total, "each version applied by exactly one run")
	})

	t.Run("PartitionedLayout", func(t *testing.T) {
		t.Parallel()
		pool, schema := setup(t)
		ctx := context.Background()
		_, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema, PartitionEventsByDay: true})
		require.NoError(t, err)
		var kind string
		require.NoError(t, pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, pgx.Identifier{schema, "events"}.Sanitize()).Scan(&kind))
		require.Equal(t, "p", kind)
	})

	// The relay, retention and the health view read events the same way
	// on both layouts: the columns (name, type, nullability, default) and
	// the names of the indexes must be the same.
	t.Run("LayoutsHaveTheSameEventsTable", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		shape := func(partitioned bool) (columns, indexes []string) {
			pool, schema := setup(t)
			_, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema, PartitionEventsByDay: partitioned})
			require.NoError(t, err)
			rows, err := pool.Query(ctx, `SELECT column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
				FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'events' ORDER BY ordinal_position`, schema)
			require.NoError(t, err)
			columns, err = pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			rows, err = pool.Query(ctx, `SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
				WHERE i.indrelid = $1::regclass ORDER BY 1`, pgx.Identifier{schema, "events"}.Sanitize())
			require.NoError(t, err)
			indexes, err = pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			return columns, indexes
		}
		plainColumns, plainIndexes := shape(false)
		dayColumns, dayIndexes := shape(true)
		require.NotEmpty(t, plainColumns)
		require.Equal(t, plainColumns, dayColumns, "the events columns differ between the plain and the day-partitioned layout")
		require.Equal(t, plainIndexes, dayIndexes, "the events indexes differ between the plain and the day-partitioned layout")
	})

	// retrying_events must list every undelivered event that failed at
	// least once: the relay's claim finds the events that hold back their
	// aggregates there and nowhere else.
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("RetryingEventsFollowFailures/partitioned=%t", partitioned), func(t *testing.T) {
			t.Parallel()
			pool, schema := setup(t)
			ctx := context.Background()
			_, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema, PartitionEventsByDay: partitioned})
			require.NoError(t, err)
			events := pgx.Identifier{schema, "events"}.Sanitize()
			rows, err := pool.Query(ctx, `INSERT INTO `+events+` (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload)
				SELECT gen_random_uuid(), 'k' || i, 'order', 'o', i, 'e', '\x00' FROM generate_series(1, 4) i RETURNING id`)
			require.NoError(t, err)
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			require.NoError(t, err)
			exec := func(sql string, args ...any) {
				t.Helper()
				_, err := pool.Exec(ctx, sql, args...)
				require.NoError(t, err)
			}
			require.Empty(t, retrying(t, pool, schema), "a new event has not failed")

			exec(`UPDATE `+events+` SET attempts = attempts + 1 WHERE id = ANY($1)`, ids[:3])
			exec(`UPDATE `+events+` SET attempts = attempts + 1 WHERE id = $1`, ids[0])
			require.Equal(t, ids[:3], retrying(t, pool, schema))

			exec(`UPDATE `+events+` SET published_at = now(), leased_until = NULL WHERE id = $1`, ids[0])
			exec(`DELETE FROM `+events+` WHERE id = $1`, ids[1])
			exec(`UPDATE `+events+` SET published_at = now() WHERE id = $1`, ids[3])
			exec(`UPDATE `+events+` SET attempts = attempts + 1 WHERE id = $1`, ids[3])
			require.Equal(t, ids[2:3], retrying(t, pool, schema), "delivered and deleted events leave; a delivered one never joins")

			exec(`UPDATE `+events+` SET published_at = NULL WHERE id = ANY($1)`, []int64{ids[0], ids[3]})
			require.Equal(t, []int64{ids[0], ids[2], ids[3]}, retrying(t, pool, schema), "a failed event made owed again joins again")
		})
	}

	// A relay's role granted rights table by table, without any on
	// retrying_events, must still be able to record a failure: the
	// triggers run as the table's owner.
	t.Run("TriggersWorkForARoleWithoutRightsOnRetryingEvents", func(t *testing.T) {
		t.Parallel()
		pool, schema := setup(t)
		ctx := context.Background()
		quoted := pgx.Identifier{schema}.Sanitize()
		_, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema})
		require.NoError(t, err)
		role := pgx.Identifier{schema + "_relay"}.Sanitize()
		_, err = pool.Exec(ctx, `CREATE ROLE `+role+`; GRANT USAGE ON SCHEMA `+quoted+` TO `+role+`;
			GRANT SELECT, INSERT, UPDATE, DELETE ON `+quoted+`.events TO `+role)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role)
			require.NoError(t, err)
		})
		id := insertEvent(t, pool, schema)
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE `+quoted+`.events SET attempts = attempts + 1 WHERE id = $1`, id); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE `+quoted+`.events SET published_at = now() WHERE id = $1`, id)
			return err
		}))
		require.Empty(t, retrying(t, pool, schema))
	})

	// A schema that the files before the baseline migrated to version 4
	// is at the baseline; one they left short of it is refused, naming
	// the version, before anything is applied.
	t.Run("SchemasOfTheFilesBeforeTheBaseline", func(t *testing.T) {
		t.Parallel()
		pool, schema := setup(t)
		ctx := context.Background()
		versions := pgx.Identifier{schema, "schema_versions"}.Sanitize()
		_, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema})
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `DELETE FROM `+versions+` WHERE version < 5;
			INSERT INTO `+versions+` (version, name) VALUES (1, '0001_producer.sql'), (2, '0002_consumer.sql'),
			(3, '0003_lighter_writes.sql'), (4, '0004_fewer_write_indexes.sql')`)
		require.NoError(t, err)
		applied, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema})
		require.NoError(t, err)
		require.Empty(t, applied)

		_, err = pool.Exec(ctx, `DELETE FROM `+versions+` WHERE version >= 3`)
		require.NoError(t, err)
		_, err = outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema})
		require.ErrorContains(t, err, "stopped at version 2 of the migration files that 0001_baseline.sql replaced")
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+versions).Scan(&n))
		require.Equal(t, 2, n, "nothing was applied")
	})

	t.Run("CallerSearchPathUntouched", func(t *testing.T) {
		t.Parallel()
		pool, schema := setup(t)
		ctx := context.Background()
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = outbox.Migrate(ctx, conn.Conn(), &outbox.MigrateConfig{Schema: schema})
		require.NoError(t, err)
		var path string
		require.NoError(t, conn.QueryRow(ctx, `SHOW search_path`).Scan(&path))
		require.Equal(t, `"$user", public`, path)
	})
}

// insertEvent inserts an undelivered event into schema's events table and
// returns its id.
func insertEvent(t *testing.T, pool *pgxpool.Pool, schema string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), `INSERT INTO `+pgx.Identifier{schema, "events"}.Sanitize()+`
		(event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload)
		VALUES (gen_random_uuid(), 'a', 'order', 'o', 1, 'e', '\x00') RETURNING id`).Scan(&id))
	return id
}

// retrying returns the ids listed in schema's retrying_events, in order.
func retrying(t *testing.T, pool *pgxpool.Pool, schema string) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id FROM `+pgx.Identifier{schema, "retrying_events"}.Sanitize()+` ORDER BY id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

func TestMigrations(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(outbox.Migrations(), "*.sql")
	require.NoError(t, err)
	require.Contains(t, names, "0001_baseline.sql")
	require.Contains(t, names, "partitioned_events.sql")
}
