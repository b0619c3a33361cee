package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgbouncer"
	"github.com/d419a114/outbox/internal/pgserver"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/operator"
)

// bouncedPool is a pool through bouncer in pgx's exec mode, which
// transaction pooling needs (no statement cache).
func bouncedPool(t *testing.T, bouncer *pgbouncer.Bouncer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(bouncer.URL)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.MaxConns = 10
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestAbandonedTransactionEndedBehindPgBouncer: Run ends the server session
// of a transaction whose handler ignores its ctx past ShutdownGrace, also
// through PgBouncer, where the connection's start-up pid is PgBouncer's and
// not the server session's.
func TestAbandonedTransactionEndedBehindPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgbouncer.Mode{pgbouncer.Session, pgbouncer.Transaction} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := newGroupBundle(t, 1)
			pool := bouncedPool(t, pgbouncer.Start(t, b.db.Server.URL, mode, nil))
			var serverPID uint32
			entered, release, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
			releaseOnce := sync.OnceFunc(func() { close(release) })
			t.Cleanup(releaseOnce) // a failed test must not leave the handler behind
			h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				defer close(returned)
				err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&serverPID)
				close(entered)
				<-release // ignores ctx
				return err
			})
			cfg := fastConfig(b.db, 1)
			cfg.ShutdownGrace = 50 * time.Millisecond
			cfg.SessionConfig = b.db.Pool.Config().ConnConfig
			b.produce(t, rec("o", 1, "stuck"))
			cl := b.client(t, b.group)
			c, err := consumer.New(pool, cl, "svc", h, cfg)
			require.NoError(t, err)
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(runCtx) }()
			<-entered
			inTx := func() bool {
				var state string
				err := b.db.Pool.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE pid = $1`, serverPID).Scan(&state)
				return err == nil && strings.HasPrefix(state, "idle in transaction")
			}
			eventually.True(t, 5*time.Second, inTx, "the handler's server session is idle in transaction")
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("Run waited for a handler that ignores its ctx")
			}
			eventually.True(t, 10*time.Second, func() bool {
				var n int
				require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, serverPID).Scan(&n))
				return n == 0
			}, fmt.Sprintf("the abandoned transaction's server session (pid %d) is still there", serverPID))
			releaseOnce()
			<-returned
			cl.Close()
		})
	}
}

// TestRequestListenerSessionConfig: the operator request listener needs a
// session of its own. Through a transaction pooler it says so at WARN
// once, naming Config.SessionConfig, and requests are still carried out by
// polling; with SessionConfig pointing at the server it listens.
func TestRequestListenerSessionConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const warning = "Config.SessionConfig"
	setup := func(t *testing.T, direct bool) (*pgtest.DB, *lockedBuffer) {
		t.Helper()
		db := pgtest.New(t, nil)
		pool := bouncedPool(t, pgbouncer.Start(t, db.Server.URL, pgbouncer.Transaction, nil))
		logs := &lockedBuffer{}
		cfg := fastConfig(db, 1)
		cfg.RequestPoll = 50 * time.Millisecond
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(logs.String())
			}
		})
		if direct {
			cfg.SessionConfig = db.Pool.Config().ConnConfig
		}
		e := newEffects(t, db)
		p, err := consumer.Handle(pool, "svc", e, cfg)
		require.NoError(t, err)
		serve(t, p)
		return db, logs
	}
	listening := func(t *testing.T, db *pgtest.DB) int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN ' || $1`, operator.Channel(db.Schema)).Scan(&n))
		return n
	}
	request := &operator.Request{Consumer: "svc", Action: operator.Discard, LetterID: 1 << 40}

	t.Run("ThroughTransactionPoolingWarnsAndPolls", func(t *testing.T) {
		t.Parallel()
		db, logs := setup(t, false)
		eventually.True(t, 60*time.Second, func() bool { return strings.Contains(logs.String(), warning) }, "no WARN naming "+warning)
		r := submitAndWait(t, db, request)
		require.Equal(t, operator.Failed, r.Status, "the request was not carried out by polling")
		require.Equal(t, 1, strings.Count(logs.String(), warning), "warned more than once")
	})
	t.Run("DirectListens", func(t *testing.T) {
		t.Parallel()
		db, logs := setup(t, true)
		eventually.True(t, 60*time.Second, func() bool { return listening(t, db) == 1 }, "the server does not listen")
		r := submitAndWait(t, db, request)
		require.Equal(t, operator.Failed, r.Status)
		require.NotContains(t, logs.String(), warning)
	})
}

// TestRouteListenerSessionConfig: a routing consumer whose targets' pools
// go through a transaction pooler listens for each target's operator
// requests on that target's own server, with the target's SessionConfig:
// a request in either target is carried out with polling an hour away.
// Config.SessionConfig, one database's, is refused with Route.
func TestRouteListenerSessionConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbs := []*pgtest.DB{pgtest.New(t, nil), pgtest.New(t, &pgtest.Opts{Server: pgtest.Own(t, pgserver.Config{})})}
	cfg := fastConfig(dbs[0], 1)
	cfg.Schema = ""
	cfg.RequestPoll = time.Hour
	cfg.Route = &consumer.Route{Owner: func(string, string) (string, error) { return "t0", nil }}
	for i, db := range dbs {
		pool := bouncedPool(t, pgbouncer.Start(t, db.Server.URL, pgbouncer.Transaction, nil))
		cfg.Route.Targets = append(cfg.Route.Targets, consumer.Target{
			Name: fmt.Sprintf("t%d", i), DB: pool, Schema: db.Schema, SessionConfig: db.Pool.Config().ConnConfig})
	}
	h := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	p, err := consumer.Handle(nil, "svc", h, cfg)
	require.NoError(t, err)
	serve(t, p)
	for _, db := range dbs {
		eventually.True(t, 60*time.Second, func() bool {
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN ' || $1`, operator.Channel(db.Schema)).Scan(&n))
			return n == 1
		}, fmt.Sprintf("the server of %s does not listen", db.Schema))
		r := submitAndWait(t, db, &operator.Request{Consumer: "svc", Action: operator.Discard, LetterID: 1 << 40})
		require.Equal(t, operator.Failed, r.Status, "the request in %s was not carried out", db.Schema)
	}

	cfg.SessionConfig = dbs[0].Pool.Config().ConnConfig
	_, err = consumer.Handle(nil, "svc", h, cfg)
	require.ErrorContains(t, err, "Targets[i].SessionConfig")
}
