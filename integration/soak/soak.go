// Package soak runs the mixed scenario for a bounded time: writers
// committing and rolling back over many aggregates, two relays, two
// consumer group members, and injected faults (relay sessions killed,
// consumer members restarted, and on kfake produce errors, lost acks and
// member crashes between the database commit and the offset commit).
// It then drains the pipeline and checks the history. The command
// integration/cmd/soak runs it.
package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/integration/history"
	"github.com/d419a114/outbox/producer"
)

// Config shapes a run. Zero fields take the defaults in brackets.
type Config struct {
	// Duration of the load and faults [2m]; draining comes on top.
	Duration time.Duration
	// DatabaseURL is the PostgreSQL server; a fresh schema is made in it
	// and dropped after. Required.
	DatabaseURL string
	// Brokers are the Kafka seed brokers; empty starts an in-process kfake
	// cluster of three brokers, which also enables produce faults.
	Brokers []string
	// Seed fixes the schedule [time-based].
	Seed uint64
	// Writers and Aggregates shape the load [8, 200].
	Writers, Aggregates int
	// MaxPause is the longest random pause between a writer's
	// transactions [20ms]. It keeps the load below what the pipeline
	// carries, so that the backlog stays bounded.
	MaxPause time.Duration
	// Partitions of the topic [6].
	Partitions int32
	// Concurrency is each consumer member's Config.Concurrency [1].
	Concurrency int
	// FaultEvery is the mean pause between faults [2s].
	FaultEvery time.Duration
	// Progress receives a line every ProgressEvery [5s]; nil is silent.
	Progress      io.Writer
	ProgressEvery time.Duration
	// DrainTimeout bounds the wait for the pipeline to empty [2m].
	DrainTimeout time.Duration
	// Logger gets the components' logs [warnings and above discarded].
	Logger *slog.Logger
}

// Result is what a run saw.
type Result struct {
	Seed    uint64
	Report  history.Report
	Elapsed time.Duration // load phase
	Drain   time.Duration
	Faults  map[string]int
	Applied int
	PerSec  float64 // effects applied per second of load phase
	Latency Percentiles
	Skipped int64 // duplicates skipped by the consumer
}

// Percentiles of commit-to-handle latency.
type Percentiles struct{ P50, P99, Max time.Duration }

// OK reports whether the history keeps the guarantees.
func (r Result) OK() bool { return r.Report.OK() }

// String renders the history table, the throughput, the latency and the
// faults.
func (r Result) String() string {
	var b strings.Builder
	b.WriteString(r.Report.String())
	fmt.Fprintf(&b, "%-22s %9.0f  events applied per second over %s of load\n", "throughput", r.PerSec, r.Elapsed.Round(time.Second))
	fmt.Fprintf(&b, "%-22s %9s  p50 %s, p99 %s, max %s\n", "commit-to-handle", "", r.Latency.P50.Round(10*time.Microsecond), r.Latency.P99.Round(10*time.Microsecond), r.Latency.Max.Round(time.Millisecond))
	fmt.Fprintf(&b, "%-22s %9s  %s\n", "faults injected", "", faultString(r.Faults))
	fmt.Fprintf(&b, "%-22s %9s  %s (seed %d)\n", "drained in", "", r.Drain.Round(time.Millisecond), r.Seed)
	return b.String()
}

func faultString(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func (c *Config) defaults() {
	if c.Duration == 0 {
		c.Duration = 2 * time.Minute
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.Writers == 0 {
		c.Writers = 8
	}
	if c.Aggregates == 0 {
		c.Aggregates = 200
	}
	if c.MaxPause == 0 {
		c.MaxPause = 20 * time.Millisecond
	}
	if c.Partitions == 0 {
		c.Partitions = 6
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.FaultEvery == 0 {
		c.FaultEvery = 2 * time.Second
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = 5 * time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 2 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// run is one run's world.
type run struct {
	cfg    Config
	url    string
	pool   *pgxpool.Pool
	schema string
	fake   *kfake.Cluster
	addrs  []string
	topic  string
	group  string
	writer *producer.Writer
	rec    history.Recorder

	mu        sync.Mutex
	unknown   []history.Write // commits that returned an error; guarded by mu
	committed []string        // event ids; guarded by mu
	faults    map[string]int  // guarded by mu
	latencies []time.Duration // guarded by mu
	commitAt  sync.Map        // event id -> time.Time of its commit
	relays    []*relay        // guarded by mu
	members   []*member       // guarded by mu
	started   int             // members started; guarded by mu
	dupes     atomic.Int64
}

func (r *run) table(name string) string { return pgx.Identifier{r.schema, name}.Sanitize() }

func (r *run) fault(kind string) {
	r.mu.Lock()
	r.faults[kind]++
	r.mu.Unlock()
}

// Run runs the soak and returns what it saw; the error is for a run that
// could not be set up or did not drain, not for a history that breaks a
// guarantee (see Result.OK).
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg.defaults()
	r := &run{cfg: cfg, url: cfg.DatabaseURL, faults: map[string]int{}}
	res := Result{Seed: cfg.Seed}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)) //nolint:gosec // seeded so that a run can be repeated; it guards nothing

	// PostgreSQL: a schema of the run's own.
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	r.pool = pool
	r.schema = fmt.Sprintf("soak_%x", rng.Uint32())
	if _, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: r.schema, Logger: cfg.Logger}); err != nil {
		return res, fmt.Errorf("migrate: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = pool.Exec(dctx, `DROP SCHEMA `+pgx.Identifier{r.schema}.Sanitize()+` CASCADE`)
	}()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+r.table("effects")+` (
		n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		event_id text NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL, seq bigint NOT NULL)`); err != nil {
		return res, err
	}
	r.writer = producer.NewWriter(&producer.WriterConfig{Schema: r.schema})

	// Kafka.
	r.addrs = cfg.Brokers
	if len(r.addrs) == 0 {
		fake, err := kfake.NewCluster(kfake.NumBrokers(3))
		if err != nil {
			return res, err
		}
		defer fake.Close()
		r.fake, r.addrs = fake, fake.ListenAddrs()
	}
	r.topic = "soak-" + r.schema
	r.group = "group-" + r.topic
	adm, err := kgo.NewClient(kgo.SeedBrokers(r.addrs...))
	if err != nil {
		return res, err
	}
	defer adm.Close()
	if resp, err := kadm.NewClient(adm).CreateTopic(ctx, cfg.Partitions, 1, nil, r.topic); err != nil || resp.Err != nil {
		return res, fmt.Errorf("create topic: %w", errors.Join(err, resp.Err))
	}

	// The pipeline.
	defer r.stopAll()
	for range 2 {
		if err := r.startRelay(); err != nil {
			return res, err
		}
		if err := r.startMember(); err != nil {
			return res, err
		}
	}
	load, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	for range cfg.Writers {
		wrng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())) //nolint:gosec // as rng
		wg.Go(func() { r.write(load, wrng) })
	}
	frng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())) //nolint:gosec // as rng
	wg.Go(func() { r.injectFaults(load, frng) })
	start := time.Now()
	progress := time.NewTicker(cfg.ProgressEvery)
	defer progress.Stop()
	end := time.NewTimer(cfg.Duration)
	defer end.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-end.C:
			break loop
		case <-progress.C:
			r.progress(start)
		}
	}
	stopLoad()
	wg.Wait()
	res.Elapsed = time.Since(start)
	applied := r.applied(ctx)

	// Drain.
	drainStart := time.Now()
	if err := r.drain(ctx, progress.C, start); err != nil {
		return res, err
	}
	res.Drain = time.Since(drainStart)
	r.stopAll()
	if err := r.record(ctx); err != nil {
		return res, err
	}
	res.Report = r.rec.Check()
	r.mu.Lock()
	res.Faults = maps(r.faults)
	lat := slices.Clone(r.latencies)
	r.mu.Unlock()
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		res.Latency = Percentiles{P50: lat[n/2], P99: lat[min(n-1, n*99/100)], Max: lat[n-1]}
	}
	res.Applied = r.applied(ctx)
	res.PerSec = float64(applied) / res.Elapsed.Seconds()
	res.Skipped = r.dupes.Load()
	return res, nil
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (r *run) progress(start time.Time) {
	if r.cfg.Progress == nil {
		return
	}
	r.mu.Lock()
	written := len(r.committed)
	faults := faultString(r.faults)
	r.mu.Unlock()
	applied := r.applied(context.Background())
	fmt.Fprintf(r.cfg.Progress, "%6s  written %7d  applied %7d  backlog %6d  faults: %s\n",
		time.Since(start).Round(time.Second), written, applied, written-applied, faults)
}

// write commits or rolls back transactions of 1 to 5 events over random
// aggregates until ctx ends.
func (r *run) write(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		events := make([]producer.Event, 1+rng.IntN(5))
		for i := range events {
			agg := fmt.Sprintf("agg-%04d", rng.IntN(r.cfg.Aggregates))
			events[i] = producer.Event{AggregateType: "account", AggregateID: agg, EventType: "soak.step", Payload: []byte("p-" + agg), Topic: r.topic}
		}
		if !r.attempt(events, rng.Float64() < 0.1) {
			pause(ctx, 50*time.Millisecond)
		}
		pause(ctx, time.Duration(rng.Int64N(int64(r.cfg.MaxPause))))
	}
}

func (r *run) attempt(events []producer.Event, rollback bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return false
	}
	defer func() { _ = tx.Rollback(ctx) }()
	written, err := r.writer.Write(ctx, tx, events...)
	if err != nil {
		return false
	}
	agg := func(i int) history.Aggregate {
		return history.Aggregate{Type: events[i].AggregateType, ID: events[i].AggregateID}
	}
	if rollback {
		_ = tx.Rollback(ctx)
		for i, w := range written {
			r.rec.Write(history.Write{EventID: w.EventID, Aggregate: agg(i), Seq: w.Seq})
		}
		return true
	}
	err = tx.Commit(ctx)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, w := range written {
		h := history.Write{EventID: w.EventID, Aggregate: agg(i), Seq: w.Seq, Committed: err == nil}
		if err != nil {
			r.unknown = append(r.unknown, h)
			continue
		}
		r.commitAt.Store(w.EventID, now)
		r.committed = append(r.committed, w.EventID)
		r.rec.Write(h)
	}
	return err == nil
}

// resolve settles commits whose outcome was unknown.
func (r *run) resolve(ctx context.Context) error {
	r.mu.Lock()
	unknown := r.unknown
	r.unknown = nil
	r.mu.Unlock()
	if len(unknown) == 0 {
		return nil
	}
	ids := make([]string, len(unknown))
	for i, w := range unknown {
		ids[i] = w.EventID
	}
	rows, err := r.pool.Query(ctx, `SELECT event_id::text FROM `+r.table("events")+` WHERE event_id = ANY($1::uuid[])`, ids)
	if err != nil {
		return err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range unknown {
		w.Committed = slices.Contains(found, w.EventID)
		if w.Committed {
			r.committed = append(r.committed, w.EventID)
		}
		r.rec.Write(w)
	}
	return nil
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// relay is one running relay.
type relay struct {
	app    string
	cancel context.CancelFunc
	done   chan error
	pool   *pgxpool.Pool
	client *kgo.Client
}

func (r *run) startRelay() error {
	r.mu.Lock()
	n := len(r.relays) + 1
	r.mu.Unlock()
	app := fmt.Sprintf("%s_relay%d", r.schema, n)
	poolCfg, err := pgxpool.ParseConfig(r.url)
	if err != nil {
		return err
	}
	poolCfg.ConnConfig.RuntimeParams["application_name"] = app
	poolCfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	if err != nil {
		return err
	}
	client, err := kgo.NewClient(kgo.SeedBrokers(r.addrs...),
		kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }),
		kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		pool.Close()
		return err
	}
	rl, err := producer.NewRelay(pool, client, &producer.RelayConfig{
		Schema: r.schema, RelayID: app, Logger: r.cfg.Logger.With("relay", app),
		BatchSize: 100, PollInterval: 100 * time.Millisecond, Lease: 3 * time.Second, PublishTimeout: time.Second,
		RebalanceInterval: 500 * time.Millisecond, MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		pool.Close()
		client.Close()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	rel := &relay{app: app, cancel: cancel, done: make(chan error, 1), pool: pool, client: client}
	go func() { rel.done <- rl.Run(ctx) }()
	r.mu.Lock()
	r.relays = append(r.relays, rel)
	r.mu.Unlock()
	return nil
}

func (rel *relay) stop() {
	rel.cancel()
	<-rel.done //nolint:errcheck // after the cancel, Run returns the context's error
	rel.pool.Close()
	rel.client.Close()
}

// member is one running consumer group member.
type member struct {
	cancel context.CancelFunc
	done   chan error
	pool   *pgxpool.Pool
	client *kgo.Client
}

func (r *run) startMember() error {
	poolCfg, err := pgxpool.ParseConfig(r.url)
	if err != nil {
		return err
	}
	// A member may own every partition: Concurrency connections for
	// each, and a few for the drainer and pruner.
	poolCfg.MaxConns = 40
	if c := r.cfg.Concurrency; c >= 0 && c < 4 {
		poolCfg.MaxConns = min(8+int32(c)*r.cfg.Partitions, 40)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	if err != nil {
		return err
	}
	client, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(r.addrs...), kgo.ConsumerGroup(r.group), kgo.ConsumeTopics(r.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.MetadataMinAge(100 * time.Millisecond),
	}, consumer.ClientOpts()...)...)
	if err != nil {
		pool.Close()
		return err
	}
	c, err := consumer.New(pool, client, "soak", consumer.HandlerFunc(r.handle), &consumer.Config{
		Schema: r.schema, Logger: r.cfg.Logger, Tracer: skips{r}, BatchSize: 20, MaxPollRecords: 500, Concurrency: r.cfg.Concurrency,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, ShutdownGrace: 5 * time.Second,
	})
	if err != nil {
		pool.Close()
		client.Close()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{cancel: cancel, done: make(chan error, 1), pool: pool, client: client}
	go func() { m.done <- c.Run(ctx) }()
	r.mu.Lock()
	r.members = append(r.members, m)
	r.started++
	r.mu.Unlock()
	return nil
}

func (m *member) stop() {
	m.cancel()
	<-m.done //nolint:errcheck // as for relays
	m.client.Close()
	m.pool.Close()
}

// handle is the application: one effect row per event. The first time an
// event reaches the handler, its commit-to-handle latency is taken.
func (r *run) handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if at, ok := r.commitAt.LoadAndDelete(m.IdempotencyKey); ok {
		d := time.Since(at.(time.Time))
		r.mu.Lock()
		r.latencies = append(r.latencies, d)
		r.mu.Unlock()
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+r.table("effects")+` (event_id, aggregate_type, aggregate_id, seq) VALUES ($1, $2, $3, $4)`,
		m.IdempotencyKey, m.AggregateType, m.AggregateID, m.Seq)
	return err
}

// skips is a consumer.Tracer that records the consumer's skips.
type skips struct{ r *run }

func (skips) TraceRecordStart(ctx context.Context, _ *kgo.Record) context.Context { return ctx }

func (h skips) TraceRecordEnd(_ context.Context, rec *kgo.Record, res consumer.Result, err error) {
	if err != nil || res.Outcome != consumer.Duplicate {
		return
	}
	h.r.dupes.Add(1)
	hd := map[string]string{}
	for _, x := range rec.Headers {
		hd[x.Key] = string(x.Value)
	}
	seq, _ := strconv.ParseInt(hd[outbox.HeaderAggregateSeq], 10, 64)
	h.r.rec.Handle(history.Handle{
		Key:       hd[outbox.HeaderIdempotencyKey],
		Aggregate: history.Aggregate{Type: hd[outbox.HeaderAggregateType], ID: hd[outbox.HeaderAggregateID]},
		Seq:       seq,
	})
}

// injectFaults injects one fault at a time until ctx ends.
func (r *run) injectFaults(ctx context.Context, rng *rand.Rand) {
	kinds := []string{"relay session kill", "consumer restart"}
	if r.fake != nil {
		kinds = append(kinds, "produce error", "lost ack", "consumer crash")
	}
	for {
		pause(ctx, r.cfg.FaultEvery/2+time.Duration(rng.Int64N(int64(r.cfg.FaultEvery))))
		if ctx.Err() != nil {
			return
		}
		kind := kinds[rng.IntN(len(kinds))]
		// Only relays produce to the cluster, so produce faults need no topic
		// filter (newer produce versions name topics by id).
		switch kind {
		case "relay session kill":
			r.mu.Lock()
			rel := r.relays[rng.IntN(len(r.relays))]
			r.mu.Unlock()
			if _, err := r.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, rel.app); err != nil {
				continue
			}
		case "consumer restart":
			r.mu.Lock()
			i := rng.IntN(len(r.members))
			m := r.members[i]
			r.members = append(r.members[:i], r.members[i+1:]...)
			r.mu.Unlock()
			m.stop()
			if err := r.startMember(); err != nil {
				r.cfg.Logger.Error("soak: restart member", "error", err)
			}
		case "consumer crash":
			// The member applies records while the broker fails its
			// group's offset commits, then stops: its effects committed,
			// its offsets never; the next owner gets them again.
			h := r.fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: r.group, Err: kerr.RebalanceInProgress, Count: -1})
			pause(ctx, 500*time.Millisecond+time.Duration(rng.Int64N(int64(500*time.Millisecond))))
			r.mu.Lock()
			i := rng.IntN(len(r.members))
			m := r.members[i]
			r.members = append(r.members[:i], r.members[i+1:]...)
			r.mu.Unlock()
			m.stop()
			h.Remove()
			if err := r.startMember(); err != nil {
				r.cfg.Logger.Error("soak: restart member", "error", err)
			}
		case "produce error":
			r.fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotLeaderForPartition, Count: 1 + rng.IntN(3)})
		case "lost ack":
			// The broker appends the records and answers REQUEST_TIMED_OUT:
			// the relay publishes them again.
			r.fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut, Count: 1})
		}
		r.fault(kind)
	}
}

func (r *run) applied(ctx context.Context) int {
	var n int
	if err := r.pool.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM `+r.table("effects")).Scan(&n); err != nil {
		return -1
	}
	return n
}

// drain waits until every committed event is applied, every outbox row is
// marked delivered, and the group's offsets reach every partition's end.
func (r *run) drain(ctx context.Context, tick <-chan time.Time, start time.Time) error {
	if err := r.resolve(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	keys := slices.Clone(r.committed)
	r.mu.Unlock()
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	cond := func(name string, f func() (bool, error)) error {
		for {
			ok, err := f()
			if err == nil && ok {
				return nil
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("drain: timed out after %s waiting for %s (last error: %v)", r.cfg.DrainTimeout, name, err) //nolint:errorlint // err may be nil; the message reports it, nothing matches on it
			}
			select {
			case <-tick:
				r.progress(start)
			default:
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := cond("every committed event applied", func() (bool, error) {
		var n int
		err := r.pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::text[]) AS k(id)
			WHERE NOT EXISTS (SELECT 1 FROM `+r.table("effects")+` e WHERE e.event_id = k.id)`, keys).Scan(&n)
		return n == 0, err
	}); err != nil {
		return err
	}
	if err := cond("every outbox row marked delivered", func() (bool, error) {
		var n int
		err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+r.table("events")+` WHERE published_at IS NULL`).Scan(&n)
		return n == 0, err
	}); err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.addrs...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	return cond("the group's offsets at every partition's end", func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ends, err := adm.ListEndOffsets(cctx, r.topic)
		if err != nil {
			return false, err
		}
		offs, err := adm.FetchOffsets(cctx, r.group)
		if err != nil {
			return false, err
		}
		ok := true
		ends.Each(func(o kadm.ListedOffset) {
			if o.Offset > 0 {
				c, found := offs.Lookup(r.topic, o.Partition)
				ok = ok && found && c.At >= o.Offset
			}
		})
		return ok, nil
	})
}

// stopAll stops every member and relay still running.
func (r *run) stopAll() {
	r.mu.Lock()
	members, relays := r.members, r.relays
	r.members, r.relays = nil, nil
	r.mu.Unlock()
	for _, m := range members {
		m.stop()
	}
	for _, rel := range relays {
		rel.stop()
	}
}

// record adds every committed effect to the history, in commit order per
// aggregate (the effects' identity order).
func (r *run) record(ctx context.Context) error {
	rows, err := r.pool.Query(ctx, `SELECT event_id, aggregate_type, aggregate_id, seq FROM `+r.table("effects")+` ORDER BY n`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		h := history.Handle{Applied: true}
		if err := rows.Scan(&h.Key, &h.Aggregate.Type, &h.Aggregate.ID, &h.Seq); err != nil {
			return err
		}
		r.rec.Handle(h)
	}
	return rows.Err()
}
