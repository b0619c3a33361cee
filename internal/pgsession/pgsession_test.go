package pgsession_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgbouncer"
	"github.com/d419a114/outbox/internal/pgsession"
	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestCheck(t *testing.T) {
	t.Parallel()
	srv, err := pgtest.Shared()
	require.NoError(t, err)
	connect := func(t *testing.T, url string) *pgx.Conn {
		t.Helper()
		// pgx's default: the statement cache, which the check must not
		// trip over behind a transaction pooler.
		conn, err := pgx.Connect(context.Background(), url)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	t.Run("Direct", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, pgsession.Check(context.Background(), connect(t, srv.URL)))
	})
	t.Run("SessionPooler", func(t *testing.T) {
		t.Parallel()
		b := pgbouncer.Start(t, srv.URL, pgbouncer.Session, &pgbouncer.Opts{PoolSize: 2})
		require.NoError(t, pgsession.Check(context.Background(), connect(t, b.URL)))
	})
	t.Run("TransactionPoolerUnderLoad", func(t *testing.T) {
		t.Parallel()
		b := pgbouncer.Start(t, srv.URL, pgbouncer.Transaction, &pgbouncer.Opts{PoolSize: 4})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer func() {
			cancel()
			wg.Wait()
		}()
		for range 4 {
			busy := connect(t, b.URL)
			wg.Go(func() {
				for ctx.Err() == nil {
					_, _ = busy.Exec(ctx, "SELECT pg_sleep(0.001)")
				}
			})
		}
		for range 10 {
			require.ErrorIs(t, pgsession.Check(context.Background(), connect(t, b.URL)), pgsession.ErrNotSession)
		}
	})
	for _, size := range []int{1, 2, 10} {
		t.Run(fmt.Sprintf("TransactionPooler/PoolSize%d", size), func(t *testing.T) {
			t.Parallel()
			b := pgbouncer.Start(t, srv.URL, pgbouncer.Transaction, &pgbouncer.Opts{PoolSize: size})
			err := pgsession.Check(context.Background(), connect(t, b.URL))
			require.ErrorIs(t, err, pgsession.ErrNotSession)
			t.Log(err)
		})
	}
}
