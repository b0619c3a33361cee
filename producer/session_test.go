package producer_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgbouncer"
	"github.com/d419a114/outbox/producer"
)

// TestRelaySessionConfig: the relay's session connection must be a session
// of its own, and through PgBouncer it is one only in session mode.
func TestRelaySessionConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// runThrough runs a relay whose pool and SessionConfig both go
	// through a PgBouncer in mode, the pool in exec mode (no statement
	// cache, as transaction pooling needs).
	// It returns the relay, a channel that yields Run's error and then
	// is closed, and Run's cancel.
	runThrough := func(t *testing.T, b *bundle, mode pgbouncer.Mode) (*producer.Relay, <-chan error, context.CancelFunc) {
		t.Helper()
		bouncer := pgbouncer.Start(t, b.db.Server.URL, mode, nil)
		poolCfg, err := pgxpool.ParseConfig(bouncer.URL)
		require.NoError(t, err)
		poolCfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		sessionCfg, err := pgx.ParseConfig(bouncer.URL)
		require.NoError(t, err)
		relay, err := producer.NewRelay(pool, b.broker.Client(t), &producer.RelayConfig{
			Schema: b.db.Schema, SessionConfig: sessionCfg, RebalanceInterval: 100 * time.Millisecond,
			PollInterval: 50 * time.Millisecond, Logger: testLogger(t),
		})
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- relay.Run(rctx)
			close(done)
		}()
		t.Cleanup(func() {
			cancel()
			for range done {
			}
		})
		return relay, done, cancel
	}

	t.Run("RefusedThroughTransactionPooling", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 1)
		b.write(t, b.event("a"))
		_, done, _ := runThrough(t, b, pgbouncer.Transaction)
		select {
		case err := <-done:
			require.ErrorIs(t, err, outbox.ErrNotSession)
			require.ErrorContains(t, err, "RelayConfig.SessionConfig")
			require.ErrorContains(t, err, "directly or at a session-mode pool")
		case <-time.After(30 * time.Second):
			t.Fatal("Run went on through a transaction pooler for 30s")
		}
		require.Equal(t, 1, b.undelivered(t), "nothing is published through a refused session")
	})

	t.Run("RunsThroughSessionPooling", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 1)
		written := b.write(t, b.event("a"), b.event("a"))
		relay, done, cancel := runThrough(t, b, pgbouncer.Session)
		b.waitDelivered(t, 30*time.Second)
		require.Len(t, checkOrder(t, b.broker.Records(t, b.topic, len(written), 10*time.Second)), len(written))
		require.Equal(t, producer.NumBuckets, relay.Health().Buckets)
		cancel()
		require.NoError(t, <-done)
	})
}

// TestRelayWarnsWithoutBuckets: a relay that can take no bucket while
// events wait says so at WARN, here within five RebalanceIntervals, and
// says nothing of it once it owns buckets. The bucket locks are held by a
// session of the test's, as they were by a PgBouncer server session in the
// incident this guards against.
func TestRelayWarnsWithoutBuckets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBundle(t, 1)
	holder, err := pgx.Connect(ctx, b.db.Server.URL)
	require.NoError(t, err)
	defer func() { _ = holder.Close(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1, b) FROM generate_series(0, $2 - 1) AS b`,
		producer.BucketLockKey(b.db.Schema), producer.NumBuckets)
	require.NoError(t, err)
	b.write(t, b.event("a"))

	logs := &syncBuffer{}
	pool, err := pgxpool.New(ctx, b.db.Server.URL)
	require.NoError(t, err)
	defer pool.Close()
	relay, err := producer.NewRelay(pool, b.broker.Client(t), &producer.RelayConfig{
		Schema: b.db.Schema, RebalanceInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	const warning = "owns no bucket while events wait"
	eventually.True(t, 10*time.Second, func() bool { return strings.Contains(logs.String(), warning) }, "no WARN from a relay without buckets")
	require.Equal(t, 0, relay.Health().Buckets)
	require.Equal(t, 1, b.undelivered(t))

	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	b.waitDelivered(t, 30*time.Second)
	warned := strings.Count(logs.String(), warning)
	b.write(t, b.event("a"))
	b.waitDelivered(t, 30*time.Second)
	require.Equal(t, warned, strings.Count(logs.String(), warning), "warned again while owning buckets")
}

// syncBuffer is a bytes.Buffer for a logger and a test's goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
