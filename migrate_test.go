package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

func TestMigrations(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(outbox.Migrations(), "*.sql")
	require.NoError(t, err)
	require.Contains(t, names, "0001_producer.sql")
	require.Contains(t, names, "partitioned_events.sql")
}
