package producer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/producer"
)

// callLog records, in order, the hooks of several tracers.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, fmt.Sprintf(format, args...))
}

func (l *callLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.calls...)
}

type tracerNameKey struct{ name string }

// publishOnly is a RelayTracer and nothing more. Its start puts its name in
// the context; its end says whether it got that context back, and the
// names of the tracers started before it that it sees.
type publishOnly struct {
	name string
	log  *callLog
}

func (p *publishOnly) TracePublishStart(ctx context.Context, _ []*kgo.Record) context.Context {
	p.log.add("%s start", p.name)
	return context.WithValue(ctx, tracerNameKey{p.name}, true)
}

func (p *publishOnly) TracePublishEnd(ctx context.Context, _ []*kgo.Record, res producer.PublishResult, _ error) {
	var seen []string
	for _, n := range []string{"a", "b", "c"} {
		if ctx.Value(tracerNameKey{n}) != nil {
			seen = append(seen, n)
		}
	}
	p.log.add("%s end %d %v", p.name, res.Delivered, seen)
}

// withClaims is a publishOnly that is also a ClaimTracer.
type withClaims struct{ publishOnly }

func (w *withClaims) TraceClaimStart(ctx context.Context) context.Context {
	w.log.add("%s claim start", w.name)
	return context.WithValue(ctx, tracerNameKey{w.name}, true)
}

func (w *withClaims) TraceClaimEnd(ctx context.Context, n int, _ error) {
	w.log.add("%s claim end %d %v", w.name, n, ctx.Value(tracerNameKey{w.name}) != nil)
}

// Tracers starts in order, each in the context the one before returned,
// and ends in the reverse order, each with its own start's context; it
// leaves out nil tracers, flattens a Tracers among its arguments, and
// forwards an optional interface only to the tracers that implement it.
func TestTracersFanOut(t *testing.T) {
	t.Parallel()
	t.Run("NoneAndOne", func(t *testing.T) {
		t.Parallel()
		require.Nil(t, producer.Tracers())
		require.Nil(t, producer.Tracers(nil, nil))
		one := &publishOnly{name: "a", log: &callLog{}}
		require.Same(t, one, producer.Tracers(nil, one))
	})
	t.Run("OrderAndContexts", func(t *testing.T) {
		t.Parallel()
		log := &callLog{}
		a := &publishOnly{name: "a", log: log}
		b := &withClaims{publishOnly{name: "b", log: log}}
		c := &publishOnly{name: "c", log: log}
		tr := producer.Tracers(a, nil, producer.Tracers(b, c))
		ctx := tr.TracePublishStart(context.Background(), nil)
		for _, n := range []string{"a", "b", "c"} {
			require.NotNil(t, ctx.Value(tracerNameKey{n}), "the work runs in a context every start contributed to")
		}
		tr.TracePublishEnd(ctx, nil, producer.PublishResult{Delivered: 2}, nil)
		claims, ok := tr.(producer.ClaimTracer)
		require.True(t, ok)
		cctx := claims.TraceClaimStart(context.Background())
		claims.TraceClaimEnd(cctx, 3, nil)
		require.Equal(t, []string{
			"a start", "b start", "c start",
			"c end 2 [a b c]", "b end 2 [a b]", "a end 2 [a]",
			"b claim start", "b claim end 3 true",
		}, log.snapshot())
	})
}

// A relay given Tracers of a tracer with every optional interface and one
// without any traces both: the first sees claims, rebalances, the
// listener and pruning as it would alone, the second each batch with the
// context its own start returned.
func TestRelayTracersReachEveryTracer(t *testing.T) {
	t.Parallel()
	b := newBundle(t, 2)
	full := &relayRecorder{}
	log := &callLog{}
	plain := &publishOnly{name: "a", log: log}
	b.startRelay(t, &producer.RelayConfig{Tracer: producer.Tracers(full, plain),
		PollInterval: 20 * time.Millisecond, RetentionInterval: 50 * time.Millisecond})
	var events []producer.Event
	for i := range 10 {
		events = append(events, b.event(aggName(i)))
	}
	b.write(t, events...)
	waitFor(t, 30*time.Second, "every batch recorded by both", func() bool {
		s := full.snapshot()
		delivered := 0
		for _, c := range log.snapshot() {
			var n int
			if _, err := fmt.Sscanf(c, "a end %d [a]", &n); err == nil {
				delivered += n
			}
		}
		return s.published.Delivered == 10 && s.ends == s.starts && s.prunes > 0 && delivered == 10
	})
	s := full.snapshot()
	require.Empty(t, s.problems)
	require.Equal(t, 10, s.claimed)
	require.Equal(t, []int{64, 64}, s.rebalance)
	require.True(t, s.listening)
}
