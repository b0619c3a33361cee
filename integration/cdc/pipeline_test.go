package cdc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/integration/history"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/producer"
)

// pipeline drives a cdc: writers that commit and roll back through
// producer.Write, and a consumer.Consumer that applies every record into
// an effects table; it records the history for the checker.
type pipeline struct {
	*cdc
	rec history.Recorder

	mu          sync.Mutex
	committed   map[string]time.Time // event id -> commit time, guarded by mu
	writeErrors int                  // guarded by mu
	// unsettled are the transactions whose COMMIT failed, guarded by mu;
	// waitApplied settles them.
	unsettled []unsettled

	duplicates, parked, dead atomic.Int64
}

func newPipeline(c *cdc) *pipeline {
	_, err := c.db.Pool.Exec(context.Background(), `CREATE TABLE `+c.db.Table("effects")+` (
		n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id text NOT NULL,
		aggregate_type text NOT NULL, aggregate_id text NOT NULL, seq bigint NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(c.t, err)
	return &pipeline{cdc: c, committed: map[string]time.Time{}}
}

// load shapes the writers' traffic.
type load struct {
	Writers, Aggregates, MaxPerTx int
	Rollback                      float64 // share of transactions rolled back after Write
	Limit                         int     // events in all, committed or not
	MaxPause                      time.Duration
}

// payload is binary on purpose: bytea must reach the topic byte for byte.
func payload(agg string, n int) []byte {
	return fmt.Appendf([]byte{0x00, 0xff, 0xfe}, "%s/%d", agg, n)
}

// startWriters runs l until Limit events were attempted; wait waits for
// that. The writers stop early when the test ends.
func (p *pipeline) startWriters(l load) (wait func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var budget atomic.Int64
	budget.Store(int64(l.Limit))
	seed := uint64(time.Now().UnixNano())
	p.t.Logf("writers' seed %d", seed)
	for i := range l.Writers {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		wg.Go(func() {
			for ctx.Err() == nil {
				n := 1 + rng.IntN(l.MaxPerTx)
				if budget.Add(-int64(n)) < 0 {
					return
				}
				events := make([]producer.Event, n)
				for j := range events {
					agg := fmt.Sprintf("agg-%03d", rng.IntN(l.Aggregates))
					events[j] = producer.Event{AggregateType: "account", AggregateID: agg, EventType: "account.credited",
						Payload: payload(agg, rng.IntN(1000)), ContentType: "application/octet-stream",
						Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
				}
				if !p.attempt(events, rng.Float64() < l.Rollback) {
					pause(ctx, 50*time.Millisecond) // the database is away; do not spin
				}
				if l.MaxPause > 0 {
					pause(ctx, time.Duration(rng.Int64N(int64(l.MaxPause))))
				}
			}
		})
	}
	p.t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return wg.Wait
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

// unsettled is a transaction whose COMMIT failed: its outcome is unknown.
type unsettled struct {
	written []producer.Written
	events  []producer.Event
}

// attempt writes events in one transaction and commits or rolls it back,
// and records the attempt. A commit whose outcome is unknown (the server
// went away during COMMIT) is settled once the writers stopped, in
// settle: looked up at once, on a server going down, a transaction whose
// commit record was flushed but not yet made visible is not found, and
// after the restart it is committed.
func (p *pipeline) attempt(events []producer.Event, rollback bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := p.db.Pool.Begin(ctx)
	if err != nil {
		p.failed()
		return false
	}
	defer func() { _ = tx.Rollback(ctx) }()
	written, err := p.writer.Write(ctx, tx, events...)
	if err != nil {
		p.failed()
		return false
	}
	agg := func(i int) history.Aggregate {
		return history.Aggregate{Type: events[i].AggregateType, ID: events[i].AggregateID}
	}
	if rollback {
		_ = tx.Rollback(ctx)
		for i, w := range written {
			p.rec.Write(history.Write{EventID: w.EventID, Aggregate: agg(i), Seq: w.Seq})
		}
		return true
	}
	err = tx.Commit(ctx)
	now := time.Now()
	if err != nil {
		p.failed()
		p.mu.Lock()
		p.unsettled = append(p.unsettled, unsettled{written: written, events: events})
		p.mu.Unlock()
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, w := range written {
		p.committed[w.EventID] = now
		p.rec.Write(history.Write{EventID: w.EventID, Aggregate: agg(i), Seq: w.Seq, Committed: true})
	}
	return true
}

// settle finds out whether the events of each unsettled transaction were
// committed, once the writers stopped: an event exists if and only if its
// transaction committed. It waits for the server to answer.
func (p *pipeline) settle() {
	p.mu.Lock()
	txs := p.unsettled
	p.unsettled = nil
	p.mu.Unlock()
	for _, tx := range txs {
		p.settleOne(tx.written, tx.events)
	}
}

// settleOne settles one transaction whose COMMIT failed.
func (p *pipeline) settleOne(written []producer.Written, events []producer.Event) {
	ids := make([]string, len(written))
	for i, w := range written {
		ids[i] = w.EventID
	}
	var found map[string]bool
	eventually.True(p.t, 2*time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rows, err := p.db.Pool.Query(ctx, `SELECT event_id::text FROM `+p.db.Table("events")+` WHERE event_id = ANY($1::uuid[])`, ids)
		if err != nil {
			return false
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return false
		}
		found = map[string]bool{}
		for _, id := range got {
			found[id] = true
		}
		return true
	}, "look up events whose commit failed")
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, w := range written {
		ok := found[w.EventID]
		if ok {
			p.committed[w.EventID] = time.Time{}
		}
		p.rec.Write(history.Write{EventID: w.EventID, Aggregate: history.Aggregate{Type: events[i].AggregateType, ID: events[i].AggregateID},
			Seq: w.Seq, Committed: ok})
	}
}

func (p *pipeline) failed() {
	p.mu.Lock()
	p.writeErrors++
	p.mu.Unlock()
}

func (p *pipeline) committedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.committed)
}

// Handle is the application: one effect row per event, in the handler's
// transaction.
func (p *pipeline) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+p.db.Table("effects")+` (event_id, aggregate_type, aggregate_id, seq) VALUES ($1, $2, $3, $4)`,
		m.IdempotencyKey, m.AggregateType, m.AggregateID, m.Seq)
	return err
}

// TraceRecordStart is the start of a consumer.Tracer, which the pipeline is
// for its end.
func (p *pipeline) TraceRecordStart(ctx context.Context, _ *kgo.Record) context.Context { return ctx }

// TraceRecordEnd records the duplicates the consumer skipped and counts
// records set aside.
func (p *pipeline) TraceRecordEnd(_ context.Context, rec *kgo.Record, res consumer.Result, err error) {
	if err != nil {
		return
	}
	switch res.Outcome {
	case consumer.Duplicate:
		p.duplicates.Add(1)
		h := headers(rec)
		seq, _ := strconv.ParseInt(h[outbox.HeaderAggregateSeq], 10, 64)
		p.rec.Handle(history.Handle{Key: h[outbox.HeaderIdempotencyKey],
			Aggregate: history.Aggregate{Type: h[outbox.HeaderAggregateType], ID: h[outbox.HeaderAggregateID]}, Seq: seq})
	case consumer.Parked:
		p.parked.Add(1)
	case consumer.DeadLettered:
		p.dead.Add(1)
		p.t.Errorf("dead-lettered %s/%d@%d: %v", rec.Topic, rec.Partition, rec.Offset, rec.Headers)
	}
}

func headers(rec *kgo.Record) map[string]string {
	h := map[string]string{}
	for _, hd := range rec.Headers {
		h[hd.Key] = string(hd.Value)
	}
	return h
}

// startConsumer runs a group member until the returned stop is called.
func (p *pipeline) startConsumer() (stop func()) {
	p.t.Helper()
	pool, err := pgxpool.New(context.Background(), p.db.Server.URL)
	require.NoError(p.t, err)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(p.w.broker.Addrs...), kgo.ConsumerGroup("g-" + p.topic),
		kgo.ConsumeTopics(p.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond)},
		consumer.ClientOpts()...)...)
	require.NoError(p.t, err)
	c, err := consumer.New(pool, cl, "ledger", p, &consumer.Config{Schema: p.db.Schema, Tracer: p, Logger: testLogger(p.t),
		CommitInterval: 200 * time.Millisecond})
	require.NoError(p.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stop = onceFunc(func() {
		cancel()
		require.NoError(p.t, <-done)
		cl.Close()
		pool.Close()
	})
	p.t.Cleanup(stop)
	return stop
}

// applied counts the effect rows.
func (p *pipeline) applied() int {
	var n int
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+p.db.Table("effects")).Scan(&n); err != nil {
		return -1
	}
	return n
}

// waitApplied settles the commits that failed (settle) and waits until
// every committed event has an effect row. Call it once the writers
// stopped.
func (p *pipeline) waitApplied(within time.Duration) {
	p.t.Helper()
	p.settle()
	var got int
	if !eventually.Within(within, func() bool {
		got = p.applied()
		return got >= p.committedCount()
	}) {
		p.t.Fatalf("%d of %d committed events applied after %s", got, p.committedCount(), within)
	}
}

// check feeds the applied effects, in the order they were applied, to the
// history and fails the test unless it keeps every guarantee.
func (p *pipeline) check() history.Report {
	p.t.Helper()
	rows, err := p.db.Pool.Query(context.Background(), `SELECT event_id, aggregate_type, aggregate_id, seq FROM `+p.db.Table("effects")+` ORDER BY n`)
	require.NoError(p.t, err)
	type effect struct {
		Key, AggType, AggID string
		Seq                 int64
	}
	effects, err := pgx.CollectRows(rows, pgx.RowToStructByPos[effect])
	require.NoError(p.t, err)
	for _, e := range effects {
		p.rec.Handle(history.Handle{Key: e.Key, Aggregate: history.Aggregate{Type: e.AggType, ID: e.AggID}, Seq: e.Seq, Applied: true})
	}
	rep := p.rec.Check()
	p.t.Logf("history:\n%s", rep)
	require.True(p.t, rep.OK(), "history:\n%s", rep)
	require.Positive(p.t, rep.Committed)
	require.Zero(p.t, p.dead.Load(), "dead-lettered records")
	var parked int
	require.NoError(p.t, p.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+p.db.Table("parked")).Scan(&parked))
	require.Zero(p.t, parked, "records still parked")
	return rep
}
