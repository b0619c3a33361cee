package producer_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgbouncer"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

// TestWriteThroughTransactionPooling: Write works through PgBouncer in
// transaction mode with pgx's exec mode, and with pgx's default statement
// cache it fails with an error that names the cause and the fix, not one
// that asks whether Migrate ran.
func TestWriteThroughTransactionPooling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	bouncer := pgbouncer.Start(t, db.Server.URL, pgbouncer.Transaction, &pgbouncer.Opts{PoolSize: 2})
	writer := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
	pool := func(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(bouncer.URL)
		require.NoError(t, err)
		cfg.ConnConfig.DefaultQueryExecMode = mode
		cfg.MaxConns = 4
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	// writeAll runs 4 writers of 50 transactions each, one or three
	// events per transaction, and returns the first error of Write.
	writeAll := func(p *pgxpool.Pool) (committed int, writeErr error) {
		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		for w := range 4 {
			wg.Go(func() {
				for i := range 50 {
					events := []producer.Event{{AggregateType: "account", AggregateID: aggName(w), EventType: "e", Topic: "t"}}
					if i%2 == 1 {
						events = append(events, events[0], events[0])
					}
					err := pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
						_, err := writer.Write(ctx, tx, events...)
						if err != nil {
							mu.Lock()
							if writeErr == nil {
								writeErr = err
							}
							mu.Unlock()
						}
						return err
					})
					if err == nil {
						mu.Lock()
						committed += len(events)
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		return committed, writeErr
	}

	t.Run("ExecMode", func(t *testing.T) {
		committed, err := writeAll(pool(t, pgx.QueryExecModeExec))
		require.NoError(t, err)
		var stored int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("events")).Scan(&stored))
		require.Equal(t, committed, stored)
		require.Equal(t, 4*(25+25*3), stored)
	})
	t.Run("StatementCacheNamesTheFix", func(t *testing.T) {
		_, err := writeAll(pool(t, pgx.QueryExecModeCacheStatement))
		require.Error(t, err, "no Write failed through transaction pooling with the statement cache")
		require.False(t, errors.Is(err, pgx.ErrTxClosed))
		require.ErrorContains(t, err, "pgx.QueryExecModeExec")
		require.ErrorContains(t, err, "max_prepared_statements")
		require.NotContains(t, err.Error(), "Migrate")
	})
}

// TestFleetShardThroughTransactionPoolingStops: a fleet shard whose
// database is a transaction pooler gives no session for its bucket locks
// and LISTEN. It stops alone, with an ERROR that names the shard and the
// fix, and publishes nothing; the fleet's other shard, on the server
// directly, delivers everything.
func TestFleetShardThroughTransactionPoolingStops(t *testing.T) {
	t.Parallel()
	w := newFleetWorld(t, 2)
	bouncer := pgbouncer.Start(t, w.base.Server.URL, pgbouncer.Transaction, nil)
	direct, bounced := w.shards[0], w.shards[1]
	bounced.Database = bouncer.URL + "&default_query_exec_mode=exec"
	logs := &lockedBuffer{}
	cfg := &producer.FleetConfig{Relay: producer.RelayConfig{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelError}))}}
	written := w.write(t, []shard.Shard{bounced}, 3, 2)
	w.write(t, []shard.Shard{direct}, 3, 2)
	w.start(t, []shard.Shard{direct, bounced}, cfg)

	eventually.True(t, 60*time.Second, func() bool {
		for _, l := range logs.lines("pool_mode=session") {
			if strings.Contains(l, "shard "+bounced.Name) {
				return true
			}
		}
		return false
	}, "no ERROR naming the shard and the fix")
	eventually.True(t, 60*time.Second, func() bool { return w.undelivered(t, direct) == 0 }, "the direct shard did not deliver")
	require.Equal(t, written, w.undelivered(t, bounced), "the pooled shard published")
}
