package pgbouncer_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgbouncer"
	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestStart checks each mode does what its name says: a transaction pins
// one server session in both, and only session mode keeps it for the
// client once the transaction ends.
func TestStart(t *testing.T) {
	t.Parallel()
	srv, err := pgtest.Shared()
	require.NoError(t, err)
	for _, mode := range []pgbouncer.Mode{pgbouncer.Session, pgbouncer.Transaction} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := pgbouncer.Start(t, srv.URL, mode, &pgbouncer.Opts{PoolSize: 2})
			a := connect(t, b.URL)
			var first int
			require.NoError(t, a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&first))
			// Another client's transaction takes the server session a
			// just used, if the pooler gives it away.
			other := connect(t, b.URL)
			tx, err := other.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			var taken int
			require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&taken))
			var again int
			require.NoError(t, a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&again))
			if mode == pgbouncer.Session {
				require.Equal(t, first, again, "session mode keeps the client's server session")
				require.NotEqual(t, first, taken)
			} else {
				require.Equal(t, first, taken, "transaction mode hands the idle server session to the next transaction")
				require.NotEqual(t, first, again)
			}
		})
	}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
