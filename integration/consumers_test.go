package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/integration/history"
)

// group is the consumer end of a scenario run by the SDK's own group
// runner (consumer.New + Run), members joining and leaving.
//
// Its handler writes each event's effect, one row, into an effects table
// in the handler's transaction. A row exists if and only if the effect
// committed, and within an aggregate the rows' identity order is the order
// the effects committed in (the aggregate's position row serializes them),
// so the history's applications are read from that table: only committed
// effects are recorded, and in the order they were applied. Skips
// (duplicates) are recorded from the consumer's hooks as they happen.
type group struct {
	s     *scenario
	name  string // the consumer name: dedupe, ordering and dead letters
	group string // the Kafka consumer group
	cfg   consumer.Config

	// fail, when set, is asked before every effect; an error fails the
	// handler.
	fail atomic.Pointer[func(*consumer.Message) error]

	mu      sync.Mutex
	members []*member // running, guarded by mu
	started int       // guarded by mu

	outcomes
}

// member is one running group member: its own pool and client.
type member struct {
	name   string
	c      *consumer.Consumer
	client *kgo.Client
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	t      interface {
		Helper()
		Fatalf(string, ...any)
		Errorf(string, ...any)
	}
}

// newGroup creates the effects table and returns the consumer side; no
// member runs yet.
func (s *scenario) newGroup(cfg consumer.Config) *group {
	s.t.Helper()
	_, err := s.db.Pool.Exec(context.Background(), `CREATE TABLE `+s.db.Table("effects")+` (
		n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		event_id text NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(s.t, err)
	cfg.Schema = s.db.Schema
	if cfg.Logger == nil {
		cfg.Logger = testLogger(s.t, "consumer")
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 5*time.Millisecond, 100*time.Millisecond
	}
	if cfg.MaxPollRecords == 0 {
		cfg.MaxPollRecords = 200
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 5 * time.Second
	}
	g := &group{s: s, name: "ledger", group: "group-" + s.topic, cfg: cfg, outcomes: outcomes{rec: &s.rec}}
	g.cfg.Tracer = g
	return g
}

// Handle is the application: one effect row per event, in the handler's
// transaction.
func (g *group) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if f := g.fail.Load(); f != nil {
		if err := (*f)(m); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+g.s.db.Table("effects")+` (event_id, aggregate_type, aggregate_id, seq) VALUES ($1, $2, $3, $4)`,
		m.IdempotencyKey, m.AggregateType, m.AggregateID, m.Seq)
	return err
}

// outcomes is a consumer.Tracer for a group's members: it counts their
// outcomes and records each skip in the history as it happens.
type outcomes struct {
	rec                      *history.Recorder
	duplicates, parked, dead atomic.Int64
}

// TraceRecordStart is the start of a consumer.Tracer, which outcomes is
// for its end.
func (o *outcomes) TraceRecordStart(ctx context.Context, _ *kgo.Record) context.Context { return ctx }

// TraceRecordEnd records skips as they happen and counts outcomes.
func (o *outcomes) TraceRecordEnd(_ context.Context, rec *kgo.Record, res consumer.Result, err error) {
	if err != nil {
		return
	}
	switch res.Outcome {
	case consumer.Duplicate:
		o.duplicates.Add(1)
		o.rec.Handle(skipped(rec))
	case consumer.Parked:
		o.parked.Add(1)
	case consumer.DeadLettered:
		o.dead.Add(1)
	}
}

// skipped is the history's Handle of rec, skipped as a duplicate.
func skipped(rec *kgo.Record) history.Handle {
	h := map[string]string{}
	for _, hd := range rec.Headers {
		h[hd.Key] = string(hd.Value)
	}
	seq, _ := strconv.ParseInt(h[outbox.HeaderAggregateSeq], 10, 64)
	return history.Handle{
		Key:       h[outbox.HeaderIdempotencyKey],
		Aggregate: history.Aggregate{Type: h[outbox.HeaderAggregateType], ID: h[outbox.HeaderAggregateID]},
		Seq:       seq,
		Applied:   false,
	}
}

// start runs a new member until it is stopped or the test ends.
func (g *group) start(opts ...kgo.Opt) *member {
	s := g.s
	s.t.Helper()
	g.mu.Lock()
	g.started++
	name := fmt.Sprintf("m%d", g.started)
	g.mu.Unlock()
	poolCfg := s.poolConfig()
	poolCfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	require.NoError(s.t, err)
	cl, err := kgo.NewClient(append(append([]kgo.Opt{
		kgo.SeedBrokers(s.broker.Addrs...),
		kgo.ConsumerGroup(g.group),
		kgo.ConsumeTopics(s.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.MetadataMinAge(100 * time.Millisecond),
	}, consumer.ClientOpts()...), opts...)...)
	require.NoError(s.t, err)
	cfg := g.cfg
	cfg.Logger = cfg.Logger.With("member", name)
	c, err := consumer.New(pool, cl, g.name, g, &cfg)
	require.NoError(s.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{name: name, c: c, client: cl, pool: pool, cancel: cancel, done: make(chan error, 1), t: s.t}
	go func() { m.done <- c.Run(ctx) }()
	g.mu.Lock()
	g.members = append(g.members, m)
	g.mu.Unlock()
	s.t.Cleanup(m.stop)
	return m
}

// stop cancels the member, waits for Run (which commits what it applied,
// unless the broker fails the commit) and closes its client and pool.
func (m *member) stop() {
	m.once.Do(func() {
		m.cancel()
		select {
		case err := <-m.done:
			if err != nil && !errors.Is(err, consumer.ErrClosed) {
				m.t.Errorf("member %s: Run: %v", m.name, err)
			}
		case <-time.After(60 * time.Second):
			m.t.Fatalf("member %s did not return within 60s of cancellation", m.name)
		}
		m.client.Close()
		m.pool.Close()
	})
}

// running returns the members not stopped through leave.
func (g *group) running() []*member {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*member(nil), g.members...)
}

// leave stops member i of the running ones and returns it.
func (g *group) leave(i int) *member {
	g.mu.Lock()
	m := g.members[i]
	g.members = append(g.members[:i], g.members[i+1:]...)
	g.mu.Unlock()
	m.stop()
	return m
}

// applied counts the events whose effect committed.
func (g *group) applied() int {
	var n int
	err := g.s.db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT event_id) FROM `+g.s.db.Table("effects")).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}

// waitApplied waits until the effects count reaches want, or covers every
// event committed so far when that is fewer: writers with a Limit stop, and
// a step must not wait for events nobody will write.
func (g *group) waitApplied(want int, within time.Duration, what string) {
	g.s.t.Helper()
	deadline := time.Now().Add(within)
	for n := g.applied(); n < want && n < g.s.committedCount(); n = g.applied() {
		if time.Now().After(deadline) {
			g.record()
			g.s.t.Fatalf("timed out after %s waiting for %s: %d effects applied, %d wanted\n%s", within, what, g.applied(), want, g.s.rec.Check())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unapplied counts committed events without an effect.
func (g *group) unapplied(keys []string) int {
	var n int
	err := g.s.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM unnest($1::text[]) AS k(id)
		WHERE NOT EXISTS (SELECT 1 FROM `+g.s.db.Table("effects")+` e WHERE e.event_id = k.id)`, keys).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}

// drain waits until every committed event's effect is applied, every outbox
// row is marked delivered, and the group's committed offsets reach the end
// of every partition (so every redelivery was handled too), then stops the
// members and records the applications in the history.
func (g *group) drain(within time.Duration) {
	s := g.s
	s.t.Helper()
	start := time.Now()
	s.resolve()
	keys := s.committedKeys()
	deadline := time.Now().Add(within)
	for {
		n := g.unapplied(keys)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			g.record()
			s.t.Fatalf("after %s, %d of %d committed events were never applied\n%s", within, n, len(keys), s.rec.Check())
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitUntil(s.t, within, "every outbox row marked delivered", func() bool {
		var n int
		err := s.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+s.db.Table("events")+` WHERE published_at IS NULL`).Scan(&n)
		return err == nil && n == 0
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.broker.Addrs...))
	require.NoError(s.t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	waitUntil(s.t, within, "the group's offsets at the end of every partition", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ends, err := adm.ListEndOffsets(ctx, s.topic)
		if err != nil || ends.Error() != nil {
			return false
		}
		offs, err := adm.FetchOffsets(ctx, g.group)
		if err != nil {
			return false
		}
		caughtUp := true
		ends.Each(func(o kadm.ListedOffset) {
			if o.Offset == 0 {
				return
			}
			c, ok := offs.Lookup(s.topic, o.Partition)
			caughtUp = caughtUp && ok && c.At >= o.Offset
		})
		return caughtUp
	})
	for _, m := range g.running() {
		m.stop()
	}
	s.t.Logf("drained in %s", time.Since(start).Round(time.Millisecond))
	g.record()
}

// record adds every committed effect to the history, in commit order per
// aggregate. Call it once, after the members stopped.
func (g *group) record() {
	s := g.s
	rows, err := s.db.Pool.Query(context.Background(), `SELECT event_id, aggregate_type, aggregate_id, seq FROM `+s.db.Table("effects")+` ORDER BY n`)
	require.NoError(s.t, err)
	defer rows.Close()
	for rows.Next() {
		var h history.Handle
		require.NoError(s.t, rows.Scan(&h.Key, &h.Aggregate.Type, &h.Aggregate.ID, &h.Seq))
		h.Applied = true
		s.rec.Handle(h)
	}
	require.NoError(s.t, rows.Err())
}

// settled fails unless nothing is parked and no dead letter is open.
func (g *group) settled() {
	s := g.s
	s.t.Helper()
	var parked, dead int
	require.NoError(s.t, s.db.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+s.db.Table("parked")+`),
		(SELECT count(*) FROM `+s.db.Table("dead_letters")+` WHERE status = 'dead')`).Scan(&parked, &dead))
	require.Zero(s.t, parked, "records still parked")
	require.Zero(s.t, dead, "dead letters still open")
	s.t.Logf("consumer outcomes: %d duplicates skipped, %d parked, %d dead-lettered", g.duplicates.Load(), g.parked.Load(), g.dead.Load())
}
