package integration

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/integration/history"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgserver"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

// shardWorld is the many-shards scenario's world: three PostgreSQL
// clusters with a producer shard each, two consumer targets on two of
// them, one topic, writers that follow their aggregates across moves,
// relay fleets over all three shards, and a routing consumer group.
type shardWorld struct {
	t      *testing.T
	broker *kafkatest.Broker
	topic  string
	shards []*shardSide
	// targets are the routing consumer's databases, by name.
	targets []*shardTarget
	rec     history.Recorder

	mu sync.Mutex
	// route is where the writers send each aggregate's next transaction:
	// its first shard, then the shard a MovedError named.
	route map[string]int
	// seqs holds each aggregate's committed sequence numbers and shards.
	seqs map[string][]shardSeq
	// committed are the committed events' writes.
	committed []history.Write
	// unknown are attempts whose commit failed, by shard; resolve looks
	// them up.
	unknown map[int][]history.Write
	// redirected counts writes refused with a MovedError, arriving counts
	// those refused because the aggregate was arriving (retried on the
	// same shard).
	redirected, arriving int
	writeErrors          int
}

// shardSeq is one committed event's sequence number and shard.
type shardSeq struct {
	seq   int64
	shard int
}

// shardSide is one producer shard: its own cluster, a migrated schema, a
// pool on it (also the test's admin connection to the cluster) and a
// writer.
type shardSide struct {
	db     *pgtest.DB
	shard  shard.Shard
	writer *producer.Writer
}

// endpoint is the shard as a side of a move.
func (s *shardSide) endpoint() move.Endpoint { return move.Endpoint{Shard: s.shard, DB: s.db.Pool} }

// shardTarget is one target of the routing consumer: a schema of its own
// on one of the clusters, with an effects table.
type shardTarget struct {
	name string
	db   *pgtest.DB
}

// newShardWorld starts three clusters, each with a shard schema, and puts
// the two targets' schemas on the first two of them.
func newShardWorld(t *testing.T, b *kafkatest.Broker, partitions int32) *shardWorld {
	t.Helper()
	w := &shardWorld{t: t, broker: b, topic: b.Topic(t, partitions), route: map[string]int{}, seqs: map[string][]shardSeq{}, unknown: map[int][]history.Write{}}
	for i := range 3 {
		srv := pgtest.Own(t, pgserver.Config{})
		db := pgtest.New(t, &pgtest.Opts{Server: srv})
		w.shards = append(w.shards, &shardSide{
			db:     db,
			shard:  shard.Shard{Name: fmt.Sprintf("shard-%d", i), Database: srv.URL, Schema: db.Schema},
			writer: producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}),
		})
	}
	for i := range 2 {
		db := pgtest.New(t, &pgtest.Opts{Server: w.shards[i].db.Server})
		_, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+db.Table("effects")+` (
			n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			event_id text NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL, seq bigint NOT NULL)`)
		require.NoError(t, err)
		w.targets = append(w.targets, &shardTarget{name: fmt.Sprintf("target-%d", i), db: db})
	}
	return w
}

// owner is the routing consumer's Route.Owner: a hash of the aggregate id
// picks the target, whichever shard the aggregate lives on.
func (w *shardWorld) owner(_, id string) (string, error) {
	return w.targetOf(id).name, nil
}

func (w *shardWorld) targetOf(id string) *shardTarget {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return w.targets[h.Sum32()%uint32(len(w.targets))]
}

// aggregateName is the id of aggregate i; aggregate i starts on shard i%3.
func aggregateName(i int) string { return fmt.Sprintf("agg-%03d", i) }

// startWriters runs writers over aggregates until the returned stop is
// called. Each transaction writes 1 to 3 events of one aggregate on the
// shard the writers last learnt it lives on.
func (w *shardWorld) startWriters(rng *rand.Rand, writers, aggregates int, rollback float64, maxPause time.Duration) (stop func()) {
	for i := range aggregates {
		w.route[aggregateName(i)] = i % len(w.shards)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range writers {
		rng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		wg.Go(func() {
			for ctx.Err() == nil {
				if !w.attempt(aggregateName(rng.IntN(aggregates)), 1+rng.IntN(3), rng.Float64() < rollback) {
					pause(ctx, 50*time.Millisecond)
				}
				pause(ctx, time.Duration(rng.Int64N(int64(maxPause))))
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
	w.t.Cleanup(stop)
	return stop
}

// attempt writes n events of agg in one transaction on its shard and
// commits it (or rolls it back), following the aggregate when a Write
// says it moved: to the shard the error names, or, while it is arriving
// there, again on the same shard a moment later. It returns false when the
// database failed the attempt.
func (w *shardWorld) attempt(agg string, n int, rollback bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		w.mu.Lock()
		at := w.route[agg]
		w.mu.Unlock()
		done, ok := w.attemptOn(ctx, at, agg, n, rollback)
		if done {
			return ok
		}
		if ctx.Err() != nil {
			w.failed()
			return false
		}
	}
}

// attemptOn is one try of attempt on shard at; done is false when the
// aggregate was refused there and the attempt goes on.
func (w *shardWorld) attemptOn(ctx context.Context, at int, agg string, n int, rollback bool) (done, ok bool) {
	sh := w.shards[at]
	tx, err := sh.db.Pool.Begin(ctx)
	if err != nil {
		w.failed()
		return true, false
	}
	defer func() { _ = tx.Rollback(ctx) }()
	events := make([]producer.Event, n)
	for i := range events {
		events[i] = producer.Event{AggregateType: "account", AggregateID: agg, EventType: "scenario.step", Payload: []byte("p-" + agg), Topic: w.topic}
	}
	written, err := sh.writer.Write(ctx, tx, events...)
	if moved := (*producer.MovedError)(nil); errors.As(err, &moved) {
		_ = tx.Rollback(ctx)
		w.moved(agg, at, moved)
		if moved.Arriving {
			time.Sleep(10 * time.Millisecond) // neither shard takes it for a moment: retry here shortly
		}
		return false, false
	}
	if err != nil {
		w.failed()
		return true, false
	}
	a := history.Aggregate{Type: "account", ID: agg}
	if rollback {
		_ = tx.Rollback(ctx)
		for _, e := range written {
			w.rec.Write(history.Write{EventID: e.EventID, Aggregate: a, Seq: e.Seq})
		}
		return true, true
	}
	err = tx.Commit(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range written {
		h := history.Write{EventID: e.EventID, Aggregate: a, Seq: e.Seq, Committed: err == nil}
		if err != nil {
			w.unknown[at] = append(w.unknown[at], h)
			continue
		}
		w.rec.Write(h)
		w.committed = append(w.committed, h)
		w.seqs[agg] = append(w.seqs[agg], shardSeq{seq: e.Seq, shard: at})
	}
	if err != nil {
		w.writeErrors++
		return true, false
	}
	return true, true
}

// moved notes a refused write: a moved aggregate is routed to its new
// shard from now on.
func (w *shardWorld) moved(agg string, at int, e *producer.MovedError) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.redirected++
	if e.Arriving {
		w.arriving++
		return
	}
	to := slices.IndexFunc(w.shards, func(s *shardSide) bool { return s.shard.Name == e.To })
	require.GreaterOrEqual(w.t, to, 0, "a write of %s on %s says it moved to unknown shard %q", agg, w.shards[at].shard.Name, e.To)
	if w.route[agg] == at {
		w.route[agg] = to
	}
}

func (w *shardWorld) failed() {
	w.mu.Lock()
	w.writeErrors++
	w.mu.Unlock()
}

// resolve settles the attempts whose commit failed by looking their events
// up on their shard.
func (w *shardWorld) resolve() {
	w.t.Helper()
	w.mu.Lock()
	unknown := w.unknown
	w.unknown = map[int][]history.Write{}
	w.mu.Unlock()
	for at, writes := range unknown {
		ids := make([]string, len(writes))
		for i, h := range writes {
			ids[i] = h.EventID
		}
		sh := w.shards[at]
		rows, err := sh.db.Pool.Query(context.Background(), `SELECT event_id::text, aggregate_seq FROM `+sh.db.Table("events")+` WHERE event_id = ANY($1::uuid[])`, ids)
		require.NoError(w.t, err)
		found := map[string]bool{}
		for rows.Next() {
			var id string
			var seq int64
			require.NoError(w.t, rows.Scan(&id, &seq))
			found[id] = true
		}
		require.NoError(w.t, rows.Err())
		w.mu.Lock()
		for _, h := range writes {
			h.Committed = found[h.EventID]
			if h.Committed {
				w.committed = append(w.committed, h)
				w.seqs[h.Aggregate.ID] = append(w.seqs[h.Aggregate.ID], shardSeq{seq: h.Seq, shard: at})
			}
			w.rec.Write(h)
		}
		w.mu.Unlock()
		w.t.Logf("resolved %d events on %s whose commit failed: %d had committed", len(writes), sh.shard.Name, len(found))
	}
}

// terminateApp ends every session of application app on db's cluster and
// waits until the server has ended them; it returns how many.
func terminateApp(t *testing.T, db *pgtest.DB, app string) int {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid`, pids)
	require.NoError(t, err)
	waitUntil(t, 30*time.Second, "terminated sessions to end", func() bool {
		var left int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&left)
		return err == nil && left == 0
	})
	return len(pids)
}

// fleetProcess is one running relay fleet over every shard, standing in for
// a process: its connections carry an application_name of their own.
type fleetProcess struct {
	name   string
	app    string
	cancel context.CancelFunc
	done   chan error
	client *kgo.Client
}

// startFleet runs a fleet over all shards, named name (its incarnation
// goes into its relay id and application_name).
func (w *shardWorld) startFleet(name string, incarnation int) *fleetProcess {
	w.t.Helper()
	client, err := kgo.NewClient(
		kgo.SeedBrokers(w.broker.Addrs...),
		kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }),
		kgo.MetadataMinAge(50*time.Millisecond),
	)
	require.NoError(w.t, err)
	app := fmt.Sprintf("scn_fleet_%s_%d", name, incarnation)
	cfg := producer.FleetConfig{Relay: scenarioRelayConfig(), ApplicationName: app}
	cfg.Relay.RelayID = app
	cfg.Relay.Logger = testLogger(w.t, app)
	shards := make([]shard.Shard, len(w.shards))
	for i, s := range w.shards {
		shards[i] = s.shard
	}
	fleet, err := producer.NewFleet(client, shards, &cfg)
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	f := &fleetProcess{name: name, app: app, cancel: cancel, done: make(chan error, 1), client: client}
	go func() { f.done <- fleet.Run(ctx) }()
	w.t.Cleanup(func() { w.stopFleet(f) })
	return f
}

// killFleet kills a fleet as its process' death would: its sessions on
// every cluster are terminated and its Kafka client closed under it
// (failing the records it buffered), then it is cancelled.
func (w *shardWorld) killFleet(f *fleetProcess) int {
	w.t.Helper()
	n := 0
	for _, s := range w.shards {
		n += terminateApp(w.t, s.db, f.app)
	}
	f.client.Close()
	w.stopFleet(f)
	return n
}

// stopFleet cancels the fleet and waits for Run; it may be called again.
func (w *shardWorld) stopFleet(f *fleetProcess) {
	f.cancel()
	select {
	case err, ok := <-f.done:
		if ok {
			require.NoError(w.t, err)
			close(f.done)
		}
	case <-time.After(60 * time.Second):
		w.t.Fatalf("fleet %s did not return within 60s of cancellation", f.app)
	}
	f.client.Close()
}

// routingGroup is the consumer group: members of consumer.New with a
// Route over the two targets, each member with a pool per target.
type routingGroup struct {
	w       *shardWorld
	started int
	members []*routingMember

	duplicates, parked, dead atomic.Int64
}

// routingMember is one running member.
type routingMember struct {
	name   string
	app    string
	cancel context.CancelFunc
	done   chan error
	client *kgo.Client
	pools  []*pgxpool.Pool
	once   sync.Once
}

// Handle is the application: one effect row per event in the effects
// table of the target that owns its aggregate, in the handler's
// transaction, which is that target's.
func (g *routingGroup) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+g.w.targetOf(m.AggregateID).db.Table("effects")+` (event_id, aggregate_type, aggregate_id, seq) VALUES ($1, $2, $3, $4)`,
		m.IdempotencyKey, m.AggregateType, m.AggregateID, m.Seq)
	return err
}

// TraceRecordStart is the start of a consumer.Tracer, which the group is
// for its end.
func (g *routingGroup) TraceRecordStart(ctx context.Context, _ *kgo.Record) context.Context {
	return ctx
}

// TraceRecordEnd records skips as they happen and counts outcomes.
func (g *routingGroup) TraceRecordEnd(_ context.Context, rec *kgo.Record, res consumer.Result, err error) {
	if err != nil {
		return
	}
	switch res.Outcome {
	case consumer.Duplicate:
		g.duplicates.Add(1)
		h := map[string]string{}
		for _, hd := range rec.Headers {
			h[hd.Key] = string(hd.Value)
		}
		seq, _ := strconv.ParseInt(h[outbox.HeaderAggregateSeq], 10, 64)
		g.w.rec.Handle(history.Handle{
			Key:       h[outbox.HeaderIdempotencyKey],
			Aggregate: history.Aggregate{Type: h[outbox.HeaderAggregateType], ID: h[outbox.HeaderAggregateID]},
			Seq:       seq,
		})
	case consumer.Parked:
		g.parked.Add(1)
	case consumer.DeadLettered:
		g.dead.Add(1)
	}
}

func (g *routingGroup) groupName() string { return "group-" + g.w.topic }

// start runs a new member until it is killed or the test ends.
func (g *routingGroup) start(concurrency int) *routingMember {
	w := g.w
	w.t.Helper()
	g.started++
	m := &routingMember{name: fmt.Sprintf("m%d", g.started), done: make(chan error, 1)}
	m.app = "scn_member_" + m.name
	route := &consumer.Route{Owner: w.owner}
	for _, tg := range w.targets {
		cfg, err := pgxpool.ParseConfig(tg.db.Server.URL)
		require.NoError(w.t, err)
		cfg.MaxConns = 8
		cfg.ConnConfig.RuntimeParams["application_name"] = m.app
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(w.t, err)
		m.pools = append(m.pools, pool)
		route.Targets = append(route.Targets, consumer.Target{Name: tg.name, DB: pool, Schema: tg.db.Schema})
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(w.broker.Addrs...),
		kgo.ConsumerGroup(g.groupName()),
		kgo.ConsumeTopics(w.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.MetadataMinAge(100 * time.Millisecond),
	}, consumer.ClientOpts()...)...)
	require.NoError(w.t, err)
	m.client = cl
	c, err := consumer.New(nil, cl, "ledger", g, &consumer.Config{
		Route:          route,
		Concurrency:    concurrency,
		MinBackoff:     5 * time.Millisecond,
		MaxBackoff:     100 * time.Millisecond,
		MaxPollRecords: 200,
		ShutdownGrace:  5 * time.Second,
		Tracer:         g,
		Logger:         testLogger(w.t, m.name),
	})
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() { m.done <- c.Run(ctx) }()
	g.members = append(g.members, m)
	w.t.Cleanup(func() { g.stop(m) })
	return m
}

// kill ends member i as its process' death would end its work: its
// sessions on both targets are terminated (transactions in flight roll
// back), then it is cancelled. On kfake the broker also refuses the
// group's offset commits from before the terminate until the member
// stopped, so that the effects it committed are never acknowledged and
// come back to the next owner of its partitions as redeliveries.
func (g *routingGroup) kill(i int) (*routingMember, int) {
	m := g.members[i]
	g.members = slices.Delete(g.members, i, i+1)
	if fake := g.w.broker.Fake; fake != nil {
		h := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: g.groupName(), Err: kerr.RebalanceInProgress, Count: -1})
		defer h.Remove()
	}
	n := 0
	for _, tg := range g.w.targets {
		n += terminateApp(g.w.t, tg.db, m.app)
	}
	g.stop(m)
	return m, n
}

// stop cancels the member, waits for Run and closes its client and pools.
func (g *routingGroup) stop(m *routingMember) {
	m.once.Do(func() {
		m.cancel()
		select {
		case err := <-m.done:
			if err != nil && !errors.Is(err, consumer.ErrClosed) {
				g.w.t.Errorf("member %s: Run: %v", m.name, err)
			}
		case <-time.After(60 * time.Second):
			g.w.t.Fatalf("member %s did not return within 60s of cancellation", m.name)
		}
		m.client.Close()
		for _, p := range m.pools {
			p.Close()
		}
	})
}

// applied counts the effects committed in both targets.
func (g *routingGroup) applied() int {
	total := 0
	for _, tg := range g.w.targets {
		var n int
		if err := tg.db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT event_id) FROM `+tg.db.Table("effects")).Scan(&n); err != nil {
			return -1
		}
		total += n
	}
	return total
}

// waitApplied waits until the effects reach want, or cover every event
// committed so far when that is fewer.
func (g *routingGroup) waitApplied(want int, within time.Duration, what string) {
	g.w.t.Helper()
	waitUntil(g.w.t, within, what, func() bool {
		g.w.mu.Lock()
		committed := len(g.w.committed)
		g.w.mu.Unlock()
		n := g.applied()
		return n >= want || n >= committed
	})
}

// drain waits until every committed event's effect is applied, every
// shard's outbox rows are all marked delivered (none held either), and the
// group's offsets reach the end of every partition; then it stops the
// members and records the effects of both targets in the history.
func (g *routingGroup) drain(within time.Duration) {
	w := g.w
	w.t.Helper()
	start := time.Now()
	w.resolve()
	w.mu.Lock()
	want := len(w.committed)
	w.mu.Unlock()
	waitUntil(w.t, within, fmt.Sprintf("all %d committed events applied", want), func() bool { return g.applied() >= want })
	ctx := context.Background()
	waitUntil(w.t, within, "every shard's outbox rows marked delivered", func() bool {
		for _, s := range w.shards {
			var n int
			if err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s.db.Table("events")+` WHERE published_at IS NULL`).Scan(&n); err != nil || n > 0 {
				return false
			}
		}
		return true
	})
	adm := kadm.NewClient(w.broker.Client(w.t))
	waitUntil(w.t, within, "the group's offsets at the end of every partition", func() bool {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ends, err := adm.ListEndOffsets(ctx, w.topic)
		if err != nil || ends.Error() != nil {
			return false
		}
		offs, err := adm.FetchOffsets(ctx, g.groupName())
		if err != nil {
			return false
		}
		caughtUp := true
		ends.Each(func(o kadm.ListedOffset) {
			if o.Offset == 0 {
				return
			}
			c, ok := offs.Lookup(w.topic, o.Partition)
			caughtUp = caughtUp && ok && c.At >= o.Offset
		})
		return caughtUp
	})
	for _, m := range g.members {
		g.stop(m)
	}
	g.members = nil
	w.t.Logf("drained in %s", time.Since(start).Round(time.Millisecond))
	for _, tg := range w.targets {
		rows, err := tg.db.Pool.Query(ctx, `SELECT event_id, aggregate_type, aggregate_id, seq FROM `+tg.db.Table("effects")+` ORDER BY n`)
		require.NoError(w.t, err)
		for rows.Next() {
			h := history.Handle{Applied: true, Where: tg.name}
			require.NoError(w.t, rows.Scan(&h.Key, &h.Aggregate.Type, &h.Aggregate.ID, &h.Seq))
			require.Same(w.t, tg, w.targetOf(h.Aggregate.ID), "effect of %s applied in %s, which does not own it", h.Aggregate, tg.name)
			w.rec.Handle(h)
		}
		require.NoError(w.t, rows.Err())
	}
}

// settled fails unless no target holds a parked record or an open dead
// letter.
func (g *routingGroup) settled() {
	w := g.w
	w.t.Helper()
	for _, tg := range w.targets {
		var parked, dead int
		require.NoError(w.t, tg.db.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+tg.db.Table("parked")+`),
			(SELECT count(*) FROM `+tg.db.Table("dead_letters")+` WHERE status = 'dead')`).Scan(&parked, &dead))
		require.Zero(w.t, parked, "records still parked in %s", tg.name)
		require.Zero(w.t, dead, "dead letters still open in %s", tg.name)
	}
	w.t.Logf("consumer outcomes: %d duplicates skipped, %d parked, %d dead-lettered", g.duplicates.Load(), g.parked.Load(), g.dead.Load())
}
