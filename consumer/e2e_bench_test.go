package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pacedwrite"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// BenchmarkEndToEnd writes events at a steady rate (producer.Write),
// publishes them with producer.Relay, and consumes them with a
// consumer.Consumer (dedupe and ordering on) whose handler inserts a row.
// It reports the latency from the writer's commit returning to the
// consumer's transaction committing (the effect is durable), p50 and p99,
// with one record per consumer transaction and with batches of up to 100,
// over five seconds after a second of warm-up. Writers, relay, consumer and
// PostgreSQL share the machine, all with synchronous commit.
//
// At 3,000 events/s the writer puts 10 events in each transaction (300
// commits/s); below, one per transaction.
//
// It also reports the median of each leg of the way, from the SDK's own
// hooks (producer.ClaimTracer and RelayTracer, consumer.Tracer, franz-go's
// client hooks), so that it says where the milliseconds go:
//
//	wake      writer's commit returned -> the claim that took the event began
//	claim     the claim statement, its commit included
//	land      claim returned -> its batch launched (TracePublishStart): the
//	          relay first waits for the batch before it to be acknowledged
//	          and marked
//	linger    launched -> the record handed to the client (Produce)
//	produce   handed to the client -> acknowledged (the produce promise)
//	fetch     acknowledged -> the consumer's client buffered it from a fetch
//	poll      buffered -> polled by the consumer's poll loop
//	dispatch  polled -> the lane's worker took it (TraceRecordStart)
//	begin     taken -> the handler runs (BEGIN, key claim, position: one round
//	          trip; in batches also the batch's earlier records' handlers)
//	handler   the handler's own statement
//	commit    handler returned -> the transaction committed (TraceRecordEnd)
//
// Medians of legs do not add up to the median of the whole; the means,
// which do, are logged (-v), and so are the means over the events at p99
// or slower: where the tail's time goes. claims/s is how often the relay claimed,
// empty claims included, while the writes went on: what its polling costs
// the database.
//
//	go test -run '^$' -bench EndToEnd -benchtime 1x ./consumer
func BenchmarkEndToEnd(b *testing.B) {
	for _, batch := range []int{1, 100} {
		for _, rate := range []int{300, 1000, 3000} {
			perTx := 1
			if rate >= 3000 {
				perTx = 10
			}
			b.Run(fmt.Sprintf("batch=%d/rate=%d/pertx=%d", batch, rate, perTx), func(b *testing.B) {
				for b.Loop() {
					l := endToEnd(b, rate, perTx, batch, 5*time.Second)
					ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
					b.ReportMetric(ms(l.p50), "p50-ms")
					b.ReportMetric(ms(l.p99), "p99-ms")
					b.ReportMetric(l.claimsPerSecond, "claims/s")
					for i, leg := range legNames {
						b.ReportMetric(ms(l.legs[i]), leg+"-ms")
					}
				}
			})
		}
	}
}

// legNames name the legs of e2eStamps, in order: leg i runs from stamp i
// to stamp i+1.
var legNames = []string{"wake", "claim", "land", "linger", "produce", "fetch", "poll", "dispatch", "begin", "handler", "commit"}

// e2eStamps are the moments one event passed, in the order of legNames
// plus the end: committed, claim start, claim end, launched, produced,
// acknowledged,
// fetched, polled, taken by the worker, handler started, handler ended,
// transaction committed.
type e2eStamps [12]time.Time

const (
	stampCommitted = iota
	stampClaimStart
	stampClaimEnd
	stampLaunched
	stampProduced
	stampAcked
	stampFetched
	stampPolled
	stampStarted
	stampHandlerStart
	stampHandlerEnd
	stampEnded
)

// e2eClock collects the stamps of every event by event id. Each stamp is
// the first one seen: a redelivered event keeps its first pass.
type e2eClock struct {
	mu     sync.Mutex
	stamps map[string]*e2eStamps
	// claims are the claims that took events, start and end, not yet
	// matched to their batch's publish: the relay publishes its batches in
	// claim order, one launch per claim.
	claims [][2]time.Time
	// claimCount counts the relay's claims, empty ones too.
	claimCount atomic.Int64
	// ended counts the events whose consumer transaction committed, and
	// all is closed when it reaches want.
	ended, want int
	all         chan struct{}
}

func newE2EClock(want int) *e2eClock {
	return &e2eClock{stamps: map[string]*e2eStamps{}, want: want, all: make(chan struct{})}
}

// stamp sets stamp i of event id to at, unless it is set.
func (c *e2eClock) stamp(id string, i int, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stampLocked(id, i, at)
}

func (c *e2eClock) stampLocked(id string, i int, at time.Time) {
	s := c.stamps[id]
	if s == nil {
		s = &e2eStamps{}
		c.stamps[id] = s
	}
	if s[i].IsZero() {
		s[i] = at
		if i == stampEnded {
			c.ended++
			if c.ended == c.want {
				close(c.all)
			}
		}
	}
}

func (c *e2eClock) endedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

func eventID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == outbox.HeaderEventID {
			return string(h.Value)
		}
	}
	return ""
}

// relayClock is the relay's tracer and its client's hooks.
type relayClock struct{ c *e2eClock }

type claimStartKey struct{}

func (r relayClock) TraceClaimStart(ctx context.Context) context.Context {
	return context.WithValue(ctx, claimStartKey{}, time.Now())
}

func (r relayClock) TraceClaimEnd(ctx context.Context, n int, err error) {
	r.c.claimCount.Add(1)
	if n == 0 || err != nil {
		return
	}
	start, _ := ctx.Value(claimStartKey{}).(time.Time)
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	r.c.claims = append(r.c.claims, [2]time.Time{start, time.Now()})
}

func (r relayClock) TracePublishStart(ctx context.Context, recs []*kgo.Record) context.Context {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	if len(r.c.claims) == 0 {
		return ctx
	}
	now := time.Now()
	claim := r.c.claims[0]
	r.c.claims = r.c.claims[1:]
	for _, rec := range recs {
		id := eventID(rec)
		r.c.stampLocked(id, stampClaimStart, claim[0])
		r.c.stampLocked(id, stampClaimEnd, claim[1])
		r.c.stampLocked(id, stampLaunched, now)
	}
	return ctx
}

func (relayClock) TracePublishEnd(context.Context, []*kgo.Record, producer.PublishResult, error) {}

// OnProduceRecordBuffered is called when Produce takes the record (its
// timestamp is that moment, but truncated to milliseconds).
func (r relayClock) OnProduceRecordBuffered(rec *kgo.Record) {
	r.c.stamp(eventID(rec), stampProduced, time.Now())
}

// OnProduceRecordUnbuffered is called with the acknowledgement.
func (r relayClock) OnProduceRecordUnbuffered(rec *kgo.Record, err error) {
	if err == nil {
		r.c.stamp(eventID(rec), stampAcked, time.Now())
	}
}

// consumerClock is the consumer's tracer and its client's hooks.
type consumerClock struct{ c *e2eClock }

func (k consumerClock) OnFetchRecordBuffered(rec *kgo.Record) {
	k.c.stamp(eventID(rec), stampFetched, time.Now())
}

func (k consumerClock) OnFetchRecordUnbuffered(rec *kgo.Record, polled bool) {
	if polled {
		k.c.stamp(eventID(rec), stampPolled, time.Now())
	}
}

func (k consumerClock) TraceRecordStart(ctx context.Context, rec *kgo.Record) context.Context {
	k.c.stamp(eventID(rec), stampStarted, time.Now())
	return ctx
}

func (k consumerClock) TraceRecordEnd(_ context.Context, rec *kgo.Record, res consumer.Result, err error) {
	if err == nil && res.Outcome == consumer.Applied {
		k.c.stamp(eventID(rec), stampEnded, time.Now())
	}
}

// e2eLatencies are one run's figures: the whole way's percentiles and
// each leg's median.
type e2eLatencies struct {
	p50, p99 time.Duration
	legs     [len(e2eStamps{}) - 1]time.Duration
	// claimsPerSecond counts the relay's claims, empty ones too: what
	// its polling costs the database.
	claimsPerSecond float64
}

func endToEnd(b *testing.B, rate, perTx, batch int, dur time.Duration) e2eLatencies {
	ctx := context.Background()
	db := pgtest.New(b, &pgtest.Opts{MaxConns: 30})
	broker := kafkatest.New(b)
	topic := broker.Topic(b, 8)
	// pacedwrite writes a second of warm-up first (rate events).
	warmup, total := rate, rate*int(dur/time.Second)
	clock := newE2EClock(warmup + total)

	relayPool, err := pgxpool.New(ctx, db.Server.URL)
	require.NoError(b, err)
	defer relayPool.Close()
	rc := relayClock{clock}
	relay, err := producer.NewRelay(relayPool, broker.Client(b, kgo.WithHooks(rc)),
		&producer.RelayConfig{Schema: db.Schema, Topic: topic, Logger: quietLogger, Tracer: rc})
	require.NoError(b, err)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(runCtx) }()

	effects := db.Table("e2e_effects")
	_, err = db.Pool.Exec(ctx, `CREATE TABLE `+effects+` (event_id text PRIMARY KEY)`)
	require.NoError(b, err)
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		clock.stamp(m.EventID, stampHandlerStart, time.Now())
		if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` VALUES ($1)`, m.EventID); err != nil {
			return err
		}
		clock.stamp(m.EventID, stampHandlerEnd, time.Now())
		return nil
	})
	cc := consumerClock{clock}
	cl := broker.Client(b, append([]kgo.Opt{kgo.ConsumerGroup("e2e"), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(10 * time.Millisecond), kgo.WithHooks(cc)},
		consumer.ClientOpts()...)...)
	c, err := consumer.New(db.Pool, cl, "e2e", h, &consumer.Config{Schema: db.Schema, BatchSize: batch, Logger: quietLogger, Tracer: cc})
	require.NoError(b, err)
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- c.Run(runCtx) }()
	defer func() {
		stop()
		<-relayDone
		<-consumerDone
	}()

	claimsBefore, measureFrom := clock.claimCount.Load(), time.Now()
	committed := pacedwrite.RunGrouped(ctx, b, db.Pool, producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}), rate, perTx, total, clock.endedCount)
	select {
	case <-clock.all:
	case <-time.After(dur + 60*time.Second):
		b.Fatalf("committed %d of %d events in the consumer", clock.endedCount(), warmup+total)
	}
	var l e2eLatencies
	l.claimsPerSecond = float64(clock.claimCount.Load()-claimsBefore) / time.Since(measureFrom).Seconds()
	clock.mu.Lock()
	defer clock.mu.Unlock()
	legs := make([][]time.Duration, len(l.legs))
	whole := make([]time.Duration, 0, len(committed))
	for id, at := range committed {
		s := clock.stamps[id]
		require.NotNil(b, s, "event %s has no stamps", id)
		s[stampCommitted] = at
		for i, d := range s.legs() {
			if d != nil {
				legs[i] = append(legs[i], *d)
			}
		}
		whole = append(whole, s[stampEnded].Sub(at))
	}
	slices.Sort(whole)
	l.p50, l.p99 = whole[len(whole)/2], whole[len(whole)*99/100]
	means := fmt.Sprintf("means (ms): whole %.3f", mean(whole))
	for i, d := range legs {
		if len(d) > 0 {
			slices.Sort(d)
			l.legs[i] = d[len(d)/2]
			means += fmt.Sprintf(", %s %.3f", legNames[i], mean(d))
		}
	}
	b.Log(means)
	b.Log(tailMeans(clock.stamps, committed, l.p99))
	return l
}

// legs are the durations of s's legs, in the order of legNames; nil where
// a stamp is missing.
func (s *e2eStamps) legs() [len(e2eStamps{}) - 1]*time.Duration {
	var out [len(e2eStamps{}) - 1]*time.Duration
	for i := range out {
		if !s[i].IsZero() && !s[i+1].IsZero() {
			d := s[i+1].Sub(s[i])
			out[i] = &d
		}
	}
	return out
}

// tailMeans says where the slowest events' time went: the mean of each leg
// over the events whose whole way took p99 or longer.
func tailMeans(stamps map[string]*e2eStamps, committed map[string]time.Time, p99 time.Duration) string {
	tail := make([][]time.Duration, len(legNames))
	var whole []time.Duration
	for id := range committed {
		s := stamps[id]
		d := s[stampEnded].Sub(s[stampCommitted])
		if d < p99 {
			continue
		}
		whole = append(whole, d)
		for i, d := range s.legs() {
			if d != nil {
				tail[i] = append(tail[i], *d)
			}
		}
	}
	out := fmt.Sprintf("means (ms) of the %d events at p99 or slower: whole %.3f", len(whole), mean(whole))
	for i, d := range tail {
		if len(d) > 0 {
			out += fmt.Sprintf(", %s %.3f", legNames[i], mean(d))
		}
	}
	return out
}

// mean is the mean of ds in milliseconds.
func mean(ds []time.Duration) float64 {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return float64(sum.Microseconds()) / 1000 / float64(max(len(ds), 1))
}
