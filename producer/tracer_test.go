package producer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox/producer"
)

type traceKey struct{}

// ctxPropagator injects the trace id a test put in ctx.
type ctxPropagator struct{}

func (ctxPropagator) Inject(ctx context.Context, h map[string]string) {
	if id, ok := ctx.Value(traceKey{}).(string); ok {
		h["traceparent"] = id
	}
}

// The trace context of Write's ctx travels with each event, under the
// event's own headers, to the record; the caller's events are left as
// they were.
func TestWriterPropagatesTraceContext(t *testing.T) {
	t.Parallel()
	b := newBundle(t, 1)
	b.writer = producer.NewWriter(&producer.WriterConfig{Schema: b.db.Schema, Propagator: ctxPropagator{}})
	plain, own := b.event("plain"), b.event("own")
	own.Headers = map[string]string{"traceparent": "mine", "x": "y"}
	events := []producer.Event{plain, own}
	ctx := context.WithValue(context.Background(), traceKey{}, "00-trace-span-01")
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.writer.Write(ctx, tx, events...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Nil(t, events[0].Headers, "the caller's event untouched")
	require.Equal(t, map[string]string{"traceparent": "mine", "x": "y"}, events[1].Headers)

	b.startRelay(t, nil)
	recs := b.broker.Records(t, b.topic, 2, 30*time.Second)
	require.Len(t, recs, 2)
	got := map[string]string{}
	for _, r := range recs {
		v, _ := header(r, "traceparent")
		got[string(r.Key)] = v
	}
	require.Equal(t, map[string]string{"plain": "00-trace-span-01", "own": "mine"}, got)
}

// relayRecorder is a RelayTracer with every optional interface, recording
// what it sees.
type relayRecorder struct {
	mu        sync.Mutex
	starts    int
	published producer.PublishResult
	ends      int
	claimed   int
	rebalance []int
	listening bool
	prunes    int
	problems  []string
}

type batchKey struct{}

func (r *relayRecorder) TracePublishStart(ctx context.Context, recs []*kgo.Record) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts++
	return context.WithValue(ctx, batchKey{}, len(recs))
}

func (r *relayRecorder) TracePublishEnd(ctx context.Context, recs []*kgo.Record, res producer.PublishResult, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Value(batchKey{}) != len(recs) {
		r.problems = append(r.problems, "publish ended with another context than its start's")
	}
	if err != nil {
		r.problems = append(r.problems, err.Error())
	}
	r.ends++
	r.published.Delivered += res.Delivered
	r.published.Failed += res.Failed
	r.published.Dead += res.Dead
}

func (r *relayRecorder) TraceClaimStart(ctx context.Context) context.Context { return ctx }

func (r *relayRecorder) TraceClaimEnd(_ context.Context, n int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.claimed += n
	}
}

func (r *relayRecorder) TraceRebalance(_ context.Context, owned, buckets int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.rebalance = []int{owned, buckets}
	}
}

func (r *relayRecorder) TraceListener(_ context.Context, up bool, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listening = up
}

func (r *relayRecorder) TracePrune(context.Context, producer.PruneResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prunes++
}

func (r *relayRecorder) snapshot() relayRecorder {
	r.mu.Lock()
	defer r.mu.Unlock()
	return relayRecorder{starts: r.starts, ends: r.ends, published: r.published, claimed: r.claimed,
		rebalance: r.rebalance, listening: r.listening, prunes: r.prunes, problems: r.problems}
}

// The relay's tracer sees every batch start and end with its counts (here
// 20 delivered, and one poison event failing twice and then dead), every
// claimed event, the rebalance that gave the only relay every bucket, the
// listener up, and pruning.
func TestRelayTracerSeesEveryBatch(t *testing.T) {
	t.Parallel()
	b := newFaultBundle(t, 2)
	poisonTopic := b.broker.Topic(t, 1)
	b.broker.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: poisonTopic, Err: kerr.MessageTooLarge, Count: -1})
	rec := &relayRecorder{}
	b.startRelay(t, &producer.RelayConfig{Tracer: rec, MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, RetentionInterval: 50 * time.Millisecond})
	var events []producer.Event
	for i := range 20 {
		events = append(events, b.event(aggName(i)))
	}
	b.write(t, events...)
	poison := b.event("sick")
	poison.Topic = poisonTopic
	b.write(t, poison)
	waitFor(t, 30*time.Second, "every batch recorded", func() bool {
		s := rec.snapshot()
		return s.published == producer.PublishResult{Delivered: 20, Failed: 3, Dead: 1} && s.ends == s.starts && s.prunes > 0
	})
	s := rec.snapshot()
	require.Empty(t, s.problems)
	require.Equal(t, 23, s.claimed, "20 events and the poison one three times")
	require.Equal(t, []int{64, 64}, s.rebalance, "the only relay owns every bucket")
	require.True(t, s.listening)
}
