package producer

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
)

func TestWakeGate(t *testing.T) {
	t.Parallel()

	t.Run("QuietForAMomentAfterNoRelayWasIdle", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			var g wakeGate
			require.True(t, g.due(), "a new gate asks")
			g.quiet()
			require.False(t, g.due(), "right after a write found no relay idle, writes do not ask")
			time.Sleep(wakeQuietFor - time.Nanosecond)
			require.False(t, g.due())
			time.Sleep(time.Nanosecond)
			require.True(t, g.due(), "after wakeQuietFor they ask again")
		})
	})

	t.Run("NilGateAlwaysAsks", func(t *testing.T) {
		t.Parallel()
		var g *wakeGate
		g.quiet()
		require.True(t, g.due())
	})

	t.Run("OneGatePerDatabase", func(t *testing.T) {
		t.Parallel()
		srv, err := pgtest.Shared()
		require.NoError(t, err)
		ctx := context.Background()
		begin := func(database string) pgx.Tx {
			t.Helper()
			cfg, err := pgx.ParseConfig(srv.URL)
			require.NoError(t, err)
			cfg.Database = database
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(func() { conn.Close(ctx) })
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(ctx) })
			return tx
		}
		gates := newWakeGates()
		a1, a2, other := begin("postgres"), begin("postgres"), begin("template1")
		g := gates.forTx(a1)
		require.NotNil(t, g)
		require.Same(t, g, gates.forTx(a1), "a connection keeps its gate")
		require.Same(t, g, gates.forTx(a2), "connections to one database share a gate")
		require.NotSame(t, g, gates.forTx(other), "another database has its own")
		require.NotSame(t, g, newWakeGates().forTx(a1), "and so has another Writer")
	})
}
