package integration

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/integration/history"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgbouncer"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// seedEnv names the variable that fixes the scenarios' random schedules. A
// failing scenario logs the value that reproduces its schedule.
const seedEnv = "SCENARIO_SEED"

// baseSeed is SCENARIO_SEED, or a fresh value chosen once per process.
var baseSeed = sync.OnceValues(func() (uint64, error) {
	if v := os.Getenv(seedEnv); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s=%q is not an unsigned decimal integer: %w", seedEnv, v, err)
		}
		return s, nil
	}
	return uint64(time.Now().UnixNano()), nil
})

// scenarioRand returns the random source of test t: the base seed mixed with
// the test's name, so that every scenario draws its own schedule and one
// SCENARIO_SEED reproduces all of them.
func scenarioRand(t *testing.T) *rand.Rand {
	t.Helper()
	base, err := baseSeed()
	require.NoError(t, err)
	h := fnv.New64a()
	_, _ = h.Write([]byte(t.Name()))
	t.Logf("schedule seed: %s=%d (reproduce with %s=%d go test -race -run '^%s$' ./integration/)",
		seedEnv, base, seedEnv, base, strings.ReplaceAll(t.Name(), "/", "$/^"))
	return rand.New(rand.NewPCG(base, h.Sum64()))
}

// scenario is one scenario's world: a schema, a topic, writers that record
// every attempt, a consumer that records every record, and relays.
//
// The consumer stands in for an application that deduplicates on the
// idempotency key: the first record of a key is its effect (applied), later
// ones are redeliveries (skipped). So the history's reorders count first
// appearances of an aggregate's sequence numbers out of dense order, and
// its duplicates are zero by construction.
type scenario struct {
	t      *testing.T
	rng    *rand.Rand // owned by the test goroutine
	db     *pgtest.DB
	broker *kafkatest.Broker
	topic  string
	writer *producer.Writer
	rec    history.Recorder

	mu sync.Mutex
	// committed maps the event ids of committed writes to their commit time.
	committed map[string]time.Time
	// consumed maps idempotency keys to the time their first record arrived.
	consumed map[string]time.Time
	// unknown are attempts whose commit returned an error: the server may or
	// may not have committed them. resolve looks them up.
	unknown []history.Write
	// writeErrors counts failed attempts (begin, write or commit).
	writeErrors int
	// next maps each partition to the offset after the last record read.
	next map[int32]int64
	// pooler, when set, is the connection pooler that the writers, the
	// relays' pools and the consumer members connect through (see
	// routeThrough); writePool is the writers' pool through it.
	pooler    *pgbouncer.Bouncer
	writePool *pgxpool.Pool
}

func newScenario(t *testing.T, rng *rand.Rand, b *kafkatest.Broker, partitions int32) *scenario {
	t.Helper()
	return newScenarioOn(t, rng, b, partitions, nil)
}

// newScenarioOn is newScenario with its schema on srv; nil means the
// shared server.
func newScenarioOn(t *testing.T, rng *rand.Rand, b *kafkatest.Broker, partitions int32, srv *pgtest.Server) *scenario {
	t.Helper()
	db := pgtest.New(t, &pgtest.Opts{Server: srv})
	return &scenario{
		t:         t,
		rng:       rng,
		db:        db,
		broker:    b,
		topic:     b.Topic(t, partitions),
		writer:    producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}),
		committed: map[string]time.Time{},
		consumed:  map[string]time.Time{},
		next:      map[int32]int64{},
	}
}

// writeLoad shapes the writers' traffic.
type writeLoad struct {
	Writers    int           // concurrent writers
	Aggregates int           // aggregate ids to spread events over
	MaxPerTx   int           // events per transaction: 1 to MaxPerTx, each on a random aggregate
	Rollback   float64       // share of transactions rolled back after the write
	MaxPause   time.Duration // random pause between a writer's transactions, up to this
	Limit      int           // stop after this many events in all; 0 means until stopped
}

// startWriters runs load until the returned stop is called (or Limit is
// reached); stop waits for the writers. The writers draw from sources seeded
// by the scenario's.
func (s *scenario) startWriters(load writeLoad) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var budget atomic.Int64
	budget.Store(int64(load.Limit))
	for range load.Writers {
		rng := rand.New(rand.NewPCG(s.rng.Uint64(), s.rng.Uint64()))
		wg.Go(func() {
			for ctx.Err() == nil {
				n := 1 + rng.IntN(load.MaxPerTx)
				if load.Limit > 0 && budget.Add(-int64(n)) < 0 {
					return
				}
				events := make([]producer.Event, n)
				for i := range events {
					events[i] = s.event(fmt.Sprintf("agg-%03d", rng.IntN(load.Aggregates)))
				}
				if _, ok := s.attempt(events, rng.Float64() < load.Rollback); !ok {
					pause(ctx, 50*time.Millisecond) // the database is away; do not spin
				}
				if load.MaxPause > 0 {
					pause(ctx, time.Duration(rng.Int64N(int64(load.MaxPause))))
				}
			}
		})
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
	s.t.Cleanup(stop)
	return stop
}

// pause paces a load generator; it is not a wait for a condition.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (s *scenario) event(agg string) producer.Event {
	return producer.Event{AggregateType: "account", AggregateID: agg, EventType: "scenario.step", Payload: []byte("p-" + agg), Topic: s.topic}
}

// attempt writes events in one transaction and commits it, or rolls it back
// when rollback is set, and records the attempt. It returns the ids of the
// events committed, and false when the database failed the attempt. The transaction does not see the writers' stop: a
// commit is never cut short by the scenario itself.
func (s *scenario) attempt(events []producer.Event, rollback bool) (committed []string, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := s.db.Pool
	if s.writePool != nil {
		db = s.writePool
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		s.failed()
		return nil, false
	}
	defer func() { _ = tx.Rollback(ctx) }()
	written, err := s.writer.Write(ctx, tx, events...)
	if err != nil {
		s.failed() // nothing was written: Write returned no ids to record
		return nil, false
	}
	if rollback {
		_ = tx.Rollback(ctx) // a failed rollback leaves nothing committed either
		for i, w := range written {
			s.rec.Write(history.Write{EventID: w.EventID, Aggregate: aggregateOf(events[i]), Seq: w.Seq, Committed: false})
		}
		return nil, true
	}
	err = tx.Commit(ctx)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, w := range written {
		h := history.Write{EventID: w.EventID, Aggregate: aggregateOf(events[i]), Seq: w.Seq, Committed: err == nil}
		if err != nil {
			s.unknown = append(s.unknown, h)
			continue
		}
		s.committed[w.EventID] = now
		s.rec.Write(h)
		committed = append(committed, w.EventID)
	}
	if err != nil {
		s.writeErrors++
		return nil, false
	}
	return committed, true
}

func (s *scenario) failed() {
	s.mu.Lock()
	s.writeErrors++
	s.mu.Unlock()
}

func aggregateOf(e producer.Event) history.Aggregate {
	return history.Aggregate{Type: e.AggregateType, ID: e.AggregateID}
}

// resolve settles the attempts whose commit failed by looking their events
// up: an event exists if and only if its transaction committed. Call it when
// the database is reachable again.
func (s *scenario) resolve() {
	s.t.Helper()
	s.mu.Lock()
	unknown := s.unknown
	s.unknown = nil
	s.mu.Unlock()
	if len(unknown) == 0 {
		return
	}
	ids := make([]string, len(unknown))
	for i, w := range unknown {
		ids[i] = w.EventID
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := s.db.Pool.Query(ctx, `SELECT event_id::text FROM `+s.db.Table("events")+` WHERE event_id = ANY($1::uuid[])`, ids)
	require.NoError(s.t, err)
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(s.t, err)
	exists := map[string]bool{}
	for _, id := range found {
		exists[id] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var committed int
	for _, w := range unknown {
		w.Committed = exists[w.EventID]
		if w.Committed {
			committed++
			s.committed[w.EventID] = time.Time{} // commit time unknown
		}
		s.rec.Write(w)
	}
	s.t.Logf("resolved %d events whose commit failed: %d had committed", len(unknown), committed)
}

// startConsumer runs a group consumer of the topic that records every
// record it reads, until the returned stop is called.
func (s *scenario) startConsumer(opts ...kgo.Opt) (stop func()) {
	s.t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(s.broker.Addrs...),
		kgo.ConsumerGroup("group-" + s.topic),
		kgo.ConsumeTopics(s.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
	}, opts...)...)
	require.NoError(s.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var fetchErrors atomic.Int64
	go func() {
		defer close(done)
		for {
			fetches := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			fetches.EachError(func(string, int32, error) { fetchErrors.Add(1) })
			fetches.EachRecord(s.consume)
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			cl.Close()
			if n := fetchErrors.Load(); n > 0 {
				s.t.Logf("consumer saw %d fetch errors", n)
			}
		})
	}
	s.t.Cleanup(stop)
	return stop
}

// consume records one record as a handler call: applied the first time its
// idempotency key is seen, skipped after. Only the consumer's goroutine
// calls it, in fetch order, which keeps each partition's order.
func (s *scenario) consume(r *kgo.Record) {
	h := map[string]string{}
	for _, hd := range r.Headers {
		h[hd.Key] = string(hd.Value)
	}
	key := h[outbox.HeaderIdempotencyKey]
	seq, err := strconv.ParseInt(h[outbox.HeaderAggregateSeq], 10, 64)
	if key == "" || err != nil {
		s.t.Errorf("record at %s/%d@%d lacks an idempotency key or sequence: %v", r.Topic, r.Partition, r.Offset, r.Headers)
		return
	}
	s.mu.Lock()
	_, seen := s.consumed[key]
	if !seen {
		s.consumed[key] = time.Now()
	}
	s.next[r.Partition] = r.Offset + 1
	s.mu.Unlock()
	s.rec.Handle(history.Handle{
		Key:       key,
		Aggregate: history.Aggregate{Type: h[outbox.HeaderAggregateType], ID: h[outbox.HeaderAggregateID]},
		Seq:       seq,
		Applied:   !seen,
		Where:     fmt.Sprintf("p%d@%d", r.Partition, r.Offset),
	})
}

// committedKeys returns the event ids committed so far.
func (s *scenario) committedKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.committed))
	for k := range s.committed {
		keys = append(keys, k)
	}
	return keys
}

// committedCount returns how many events were committed so far.
func (s *scenario) committedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.committed)
}

// missing counts keys not consumed yet.
func (s *scenario) missing(keys []string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if _, ok := s.consumed[k]; !ok {
			n++
		}
	}
	return n
}

// waitConsumed waits until every event in keys (nil: every committed
// event) was consumed, and fails with the history's report if that does not
// happen within the deadline.
func (s *scenario) waitConsumed(keys []string, within time.Duration) {
	s.t.Helper()
	if keys == nil {
		s.resolve()
		keys = s.committedKeys()
	}
	deadline := time.Now().Add(within)
	for {
		n := s.missing(keys)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("after %s, %d of %d committed events were never consumed\n%s", within, n, len(keys), s.rec.Check())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drain waits until the pipeline is empty: every committed event consumed,
// every outbox row marked delivered (so no live relay will publish again),
// and the consumer at the end of every partition (so it has read every
// redelivery too). Stop or kill zombies before: a frozen relay can still
// publish when it wakes.
func (s *scenario) drain(within time.Duration) {
	s.t.Helper()
	start := time.Now()
	s.waitConsumed(nil, within)
	waitUntil(s.t, within, "every outbox row marked delivered", func() bool {
		var n int
		err := s.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+s.db.Table("events")+` WHERE published_at IS NULL`).Scan(&n)
		return err == nil && n == 0
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.broker.Addrs...))
	require.NoError(s.t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, s.topic)
	require.NoError(s.t, err)
	require.NoError(s.t, ends.Error())
	waitUntil(s.t, within, "the consumer at the end of every partition", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		caughtUp := true
		ends.Each(func(o kadm.ListedOffset) {
			caughtUp = caughtUp && s.next[o.Partition] >= o.Offset
		})
		return caughtUp
	})
	s.t.Logf("drained in %s", time.Since(start).Round(time.Millisecond))
}

// check fails unless the history keeps the guarantees; it returns the
// report for scenario-specific expectations.
func (s *scenario) check() history.Report {
	s.t.Helper()
	rep := s.rec.Check()
	s.mu.Lock()
	errs := s.writeErrors
	s.mu.Unlock()
	s.t.Logf("history (write errors: %d):\n%s", errs, rep)
	if rep.Reorders > 0 {
		s.logWire(rep)
	}
	require.Positive(s.t, rep.Committed, "the scenario committed nothing")
	seed, _ := baseSeed()
	require.True(s.t, rep.OK(), "the history breaks a guarantee (%s=%d reproduces the schedule):\n%s", seedEnv, seed, rep)
	return rep
}

// logWire reads the topic back from the broker and logs, for each
// aggregate in the report's reorder examples, every record of it in offset
// order: whether the consumer saw what the topic holds (a record skipped by
// the consumer and seen again as a redelivery) or the topic itself holds
// seq n+1 before any copy of seq n.
func (s *scenario) logWire(rep history.Report) {
	s.t.Helper()
	aggs := map[string]bool{}
	for _, ex := range rep.ReorderedKeys {
		if agg, _, ok := strings.Cut(ex, " "); ok {
			aggs[agg] = true
		}
	}
	recs := s.broker.Records(s.t, s.topic, rep.Handles, 30*time.Second)
	lines := map[string][]string{}
	for _, r := range recs {
		h := map[string]string{}
		for _, hd := range r.Headers {
			h[hd.Key] = string(hd.Value)
		}
		agg := h[outbox.HeaderAggregateType] + "/" + h[outbox.HeaderAggregateID]
		if aggs[agg] {
			lines[agg] = append(lines[agg], fmt.Sprintf("p%d@%d seq %s %s", r.Partition, r.Offset, h[outbox.HeaderAggregateSeq], h[outbox.HeaderIdempotencyKey]))
		}
	}
	for agg, l := range lines {
		s.t.Logf("the topic holds %d records of %s (of %d read back), in offset order:\n%s", len(l), agg, len(recs), strings.Join(l, "\n"))
	}
}

// relay is one running relay instance. Its connections carry its own
// application_name, so that a test can terminate exactly its sessions.
type relay struct {
	t      *testing.T
	name   string // as given to startRelay
	app    string // application_name of its sessions
	cancel context.CancelFunc
	done   chan error
	pool   *pgxpool.Pool
	client *kgo.Client
	once   sync.Once
	// closeOnce guards client.Close, which closeClient may call early.
	closeOnce sync.Once
}

// closeClient closes the relay's Kafka client, failing the records it has
// buffered with kgo.ErrClientClosed.
func (r *relay) closeClient() { r.closeOnce.Do(r.client.Close) }

// scenarioRelayConfig is quick to notice everything, with a short lease so
// that a crashed relay's events are taken over within seconds.
func scenarioRelayConfig() producer.RelayConfig {
	return producer.RelayConfig{
		BatchSize:         50,
		PollInterval:      100 * time.Millisecond,
		Lease:             2 * time.Second,
		PublishTimeout:    time.Second,
		RebalanceInterval: 100 * time.Millisecond,
		MinBackoff:        10 * time.Millisecond,
		MaxBackoff:        200 * time.Millisecond,
	}
}

// startRelay runs a relay named name until its stop is called or the test
// ends. tracer, when not nil, sees every statement of the relay's
// connections, which lets a test stop the relay at a chosen point.
func (s *scenario) startRelay(name string, cfg producer.RelayConfig, tracer pgx.QueryTracer, opts ...kgo.Opt) *relay {
	s.t.Helper()
	poolCfg := s.poolConfig()
	app := "scn_" + s.db.Schema + "_" + name
	poolCfg.ConnConfig.RuntimeParams["application_name"] = app
	poolCfg.ConnConfig.Tracer = tracer
	poolCfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	require.NoError(s.t, err)
	client, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(s.broker.Addrs...),
		kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }),
		kgo.MetadataMinAge(50 * time.Millisecond),
	}, opts...)...)
	require.NoError(s.t, err)
	cfg.Schema = s.db.Schema
	cfg.RelayID = app
	cfg.Logger = testLogger(s.t, name)
	rl, err := producer.NewRelay(pool, client, &cfg)
	require.NoError(s.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &relay{t: s.t, name: name, app: app, cancel: cancel, done: make(chan error, 1), pool: pool, client: client}
	go func() { r.done <- rl.Run(ctx) }()
	s.t.Cleanup(r.stop)
	return r
}

// stop cancels the relay, waits for Run to return and closes its pool and
// client.
func (r *relay) stop() {
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			require.NoError(r.t, err)
		case <-time.After(60 * time.Second):
			r.t.Fatalf("relay %s did not return within 60s of cancellation", r.app)
		}
		r.pool.Close()
		r.closeClient()
	})
}

// terminate ends every PostgreSQL session of application app, as the death
// of its process would, and returns how many it ended. It returns once the
// server has ended them: pg_terminate_backend only signals the backend, and
// a backend that has not handled the signal yet still executes statements.
func (s *scenario) terminate(app string) int {
	s.t.Helper()
	ctx := context.Background()
	// Two statements: in one, nothing stops the planner from calling
	// pg_terminate_backend before filtering on the application name.
	rows, err := s.db.Pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	require.NoError(s.t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(s.t, err)
	_, err = s.db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid`, pids)
	require.NoError(s.t, err)
	waitUntil(s.t, 30*time.Second, "terminated sessions to end", func() bool {
		var left int
		err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&left)
		return err == nil && left == 0
	})
	return len(pids)
}

// waitUntil polls cond until it holds, or fails after within.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitClosed waits for ch to close (or to deliver a value), or fails after
// within.
func waitClosed(t *testing.T, ch <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(within):
		t.Fatalf("timed out after %s waiting for %s", within, what)
	}
}

// testLogger sends a component's warnings and errors to the test's log,
// shown when the test fails or runs with -v.
func testLogger(t *testing.T, name string) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})).With(slog.String("instance", name))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
