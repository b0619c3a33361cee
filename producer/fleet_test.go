package producer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

// fleetWorld is a fleet test's schemas on one server and a topic.
type fleetWorld struct {
	base    *pgtest.DB
	broker  *kafkatest.Broker
	topic   string
	shards  []shard.Shard
	appName string
}

// newFleetWorld migrates n schemas (the base test schema and n-1 more,
// dropped when the test ends) and names a shard for each.
func newFleetWorld(t *testing.T, n int) *fleetWorld {
	t.Helper()
	base := pgtest.New(t, nil)
	broker := kafkatest.New(t)
	w := &fleetWorld{base: base, broker: broker, topic: broker.Topic(t, 4), appName: "fleet_" + base.Schema}
	ctx := context.Background()
	for i := range n {
		schema := base.Schema
		if i > 0 {
			schema = fmt.Sprintf("%s_%03d", base.Schema, i)
			_, err := outbox.Migrate(ctx, base.Pool, &outbox.MigrateConfig{Schema: schema, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			require.NoError(t, err)
			t.Cleanup(func() {
				_, err := base.Pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
				require.NoError(t, err)
			})
		}
		w.shards = append(w.shards, shard.Shard{Name: fmt.Sprintf("tenant-%03d", i), Database: base.Server.URL, Schema: schema})
	}
	return w
}

// write commits, in each of the shards, rounds transactions that each add
// one event to each of aggs aggregates, whose ids name the shard.
func (w *fleetWorld) write(t testing.TB, shards []shard.Shard, aggs, rounds int) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	for _, s := range shards {
		writer := producer.NewWriter(&producer.WriterConfig{Schema: s.Schema})
		for range rounds {
			tx, err := w.base.Pool.Begin(ctx)
			require.NoError(t, err)
			var events []producer.Event
			for a := range aggs {
				id := fmt.Sprintf("%s/acct-%d", s.Name, a)
				events = append(events, producer.Event{AggregateType: "account", AggregateID: id, EventType: "funds.moved", Payload: []byte(id), Topic: w.topic})
			}
			_, err = writer.Write(ctx, tx, events...)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			n += len(events)
		}
	}
	return n
}

func (w *fleetWorld) undelivered(t testing.TB, s shard.Shard) int {
	t.Helper()
	var n int
	require.NoError(t, w.base.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+pgx.Identifier{s.Schema, "events"}.Sanitize()+` WHERE published_at IS NULL`).Scan(&n))
	return n
}

// connections counts the fleet's connections on the server.
func (w *fleetWorld) connections(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, w.base.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, w.appName).Scan(&n))
	return n
}

// start runs a fleet over shards until the returned stop is called (or
// the test ends) and checks that Run returned nil.
func (w *fleetWorld) start(t *testing.T, shards []shard.Shard, cfg *producer.FleetConfig) (*producer.Fleet, func()) {
	t.Helper()
	c := producer.FleetConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.ApplicationName = w.appName
	if c.Relay.Logger == nil {
		c.Relay.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	fleet, err := producer.NewFleet(w.broker.Client(t), shards, &c)
	require.NoError(t, err)
	return fleet, runInBackground(t, "fleet", fleet.Run, func() {})
}

// TestFleetHundredSchemasTenConnections runs one fleet over 100 tenant
// schemas of one server: every event of every schema is delivered in
// per-aggregate order while the fleet's connections, sampled from
// pg_stat_activity throughout, never exceed the budget of 10.
func TestFleetHundredSchemasTenConnections(t *testing.T) {
	const shards, budget = 100, 10
	w := newFleetWorld(t, shards)

	var peak atomic.Int64
	sampling, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for sampling.Err() == nil {
			select {
			case <-sampling.Done():
				return
			case <-tick.C:
			}
			var n int64
			err := w.base.Pool.QueryRow(sampling, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, w.appName).Scan(&n)
			if err == nil && n > peak.Load() {
				peak.Store(n)
			}
		}
	}()
	fleet, stop := w.start(t, w.shards, &producer.FleetConfig{MaxConnsPerServer: budget})

	const aggs, rounds = 3, 4
	want := w.write(t, w.shards, aggs, rounds)
	records := w.broker.Records(t, w.topic, want, 2*time.Minute)
	ids := checkOrder(t, records)
	require.Len(t, ids, want, "every event of every schema is on the wire")
	eventually.True(t, time.Minute, func() bool {
		for _, s := range w.shards {
			if w.undelivered(t, s) > 0 {
				return false
			}
		}
		return true
	}, "every schema's events marked delivered")

	health := fleet.Health()
	require.Len(t, health, shards)
	for _, s := range w.shards {
		require.Equal(t, 64, health[s.Name].Buckets, "shard %s owns every bucket of its schema", s.Name)
	}
	stop()
	stopSampling()
	<-sampled
	t.Logf("peak connections of the fleet over %d schemas: %d", shards, peak.Load())
	require.Positive(t, peak.Load(), "the sampler saw the fleet's connections")
	require.LessOrEqual(t, peak.Load(), int64(budget))
	eventually.True(t, 10*time.Second, func() bool { return w.connections(t) == 0 }, "the fleet closed its connections")
}

// TestFleetSetAddsAndRemovesShards changes a running fleet's shards: an
// added shard is published, and a removed one releases its buckets, which
// a plain Relay over its schema then takes, every one.
func TestFleetSetAddsAndRemovesShards(t *testing.T) {
	t.Parallel()
	w := newFleetWorld(t, 3)
	a, b, c := w.shards[0], w.shards[1], w.shards[2]
	fleet, _ := w.start(t, []shard.Shard{a}, &producer.FleetConfig{Relay: producer.RelayConfig{RebalanceInterval: 200 * time.Millisecond}})

	n := w.write(t, []shard.Shard{a}, 2, 3)
	require.Len(t, checkOrder(t, w.broker.Records(t, w.topic, n, time.Minute)), n)

	require.NoError(t, fleet.Set([]shard.Shard{a, b, c}))
	n += w.write(t, []shard.Shard{b, c}, 2, 3)
	require.Len(t, checkOrder(t, w.broker.Records(t, w.topic, n, time.Minute)), n)
	require.Len(t, fleet.Health(), 3)

	require.NoError(t, fleet.Set([]shard.Shard{b, c}))
	require.NotContains(t, fleet.Health(), a.Name)
	var rows int
	require.NoError(t, w.base.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{a.Schema, "relays"}.Sanitize()).Scan(&rows))
	require.Zero(t, rows, "the removed shard left its schema's relays table")

	// A relay started over the removed shard's schema takes all its
	// buckets: the fleet released them (their locks would otherwise keep
	// it from any while the fleet's session lives).
	poolCfg, err := pgxpool.ParseConfig(w.base.Server.URL)
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	require.NoError(t, err)
	defer pool.Close()
	relay, err := producer.NewRelay(pool, w.broker.Client(t), &producer.RelayConfig{Schema: a.Schema, Logger: testLogger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	eventually.True(t, 20*time.Second, func() bool { return relay.Health().Buckets == 64 }, "the relay took every bucket of the removed shard")
	n += w.write(t, []shard.Shard{a, b}, 2, 3)
	require.Len(t, checkOrder(t, w.broker.Records(t, w.topic, n, time.Minute)), n)
	cancel()
	require.NoError(t, <-done)
}

// TestFleetSharesBucketsWithARelay runs a fleet and a plain Relay over the
// same schema: they split its buckets, and a stream of events is
// delivered in per-aggregate order.
func TestFleetSharesBucketsWithARelay(t *testing.T) {
	t.Parallel()
	w := newFleetWorld(t, 1)
	s := w.shards[0]
	fleet, _ := w.start(t, w.shards, &producer.FleetConfig{Relay: producer.RelayConfig{RebalanceInterval: 200 * time.Millisecond}})
	poolCfg, err := pgxpool.ParseConfig(w.base.Server.URL)
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	require.NoError(t, err)
	defer pool.Close()
	relay, err := producer.NewRelay(pool, w.broker.Client(t), &producer.RelayConfig{Schema: s.Schema, Logger: testLogger(t), RebalanceInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	eventually.True(t, 20*time.Second, func() bool {
		f, r := fleet.Health()[s.Name].Buckets, relay.Health().Buckets
		return f == 32 && r == 32
	}, "the fleet's shard and the relay split the buckets")
	n := w.write(t, w.shards, 20, 10)
	require.Len(t, checkOrder(t, w.broker.Records(t, w.topic, n, time.Minute)), n)
	cancel()
	require.NoError(t, <-done)
}

// TestFleetSurvivesLosingItsLockSession terminates the session that holds
// every shard's bucket locks: each shard takes its buckets again in a new
// session, and events written before and after are all delivered in
// per-aggregate order.
func TestFleetSurvivesLosingItsLockSession(t *testing.T) {
	t.Parallel()
	w := newFleetWorld(t, 4)
	fleet, _ := w.start(t, w.shards, &producer.FleetConfig{Relay: producer.RelayConfig{RebalanceInterval: 200 * time.Millisecond}})
	n := w.write(t, w.shards, 3, 3)
	require.Len(t, checkOrder(t, w.broker.Records(t, w.topic, n, time.Minute)), n)

	ctx := context.Background()
	lockSession := func() (pid int) {
		err := w.base.Pool.QueryRow(ctx, `SELECT coalesce(min(l.pid), 0) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE l.locktype = 'advisory' AND a.application_name = $1`, w.appName).Scan(&pid)
		require.NoError(t, err)
		return pid
	}
	var old int
	eventually.True(t, 10*time.Second, func() bool { old = lockSession(); return old != 0 }, "the fleet holds bucket locks")
	_, err := w.base.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, old)
	require.NoError(t, err)
	n += w.write(t, w.shards, 3, 3)
	eventually.True(t, 20*time.Second, func() bool {
		if pid := lockSession(); pid == 0 || pid == old {
			return false
		}
		for _, h := range fleet.Health() {
			if h.Buckets != 64 {
				return false
			}
		}
		return true
	}, "every shard took its buckets again in a new session")
	n += w.write(t, w.shards, 3, 3)
	require.Len(t, checkOrder(t, w.broker.Records(t, w.topic, n, time.Minute)), n)
}

// TestFleetHoldsAggregatesLeasedElsewhere starts a fleet over a schema
// where rows of one aggregate are leased, as a relay that died while
// publishing leaves them: the shard, which looks up leases on its pool
// rather than its lock session, holds that aggregate until the lease ends
// and delivers the others at once, then the held one, in order.
func TestFleetHoldsAggregatesLeasedElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newFleetWorld(t, 2)
	n := w.write(t, w.shards, 4, 3)
	s := w.shards[1]
	_, err := w.base.Pool.Exec(ctx, `UPDATE `+pgx.Identifier{s.Schema, "events"}.Sanitize()+`
		SET leased_until = now() + interval '8 seconds' WHERE aggregate_id = $1`, s.Name+"/acct-0")
	require.NoError(t, err)
	fleet, _ := w.start(t, w.shards, nil)
	eventually.True(t, 20*time.Second, func() bool { return w.undelivered(t, s) == 3 && w.undelivered(t, w.shards[0]) == 0 },
		"everything but the leased aggregate delivered")
	held := fleet.Health()[s.Name].Held
	require.Len(t, held, 1, "the shard holds the leased aggregate")
	require.Equal(t, s.Name+"/acct-0", held[0].AggregateID)
	require.Empty(t, fleet.Health()[w.shards[0].Name].Held, "the other shard holds nothing")
	require.Len(t, checkOrder(t, w.broker.Records(t, w.topic, n, time.Minute)), n)
}
