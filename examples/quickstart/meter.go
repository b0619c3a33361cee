package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/producer"
)

// meter is what a metrics adapter does, in miniature, through the core's
// hooks: it is the relay's RelayTracer and the consumer's Tracer, and
// prints what it measured at the end. outboxprom and outboxotel do the
// same for Prometheus and OpenTelemetry.
type meter struct {
	mu       sync.Mutex
	batches  int
	sent     producer.PublishResult
	lag      []time.Duration // from Write's commit to the broker's ack
	outcomes map[string]int
	took     []time.Duration // a record's processing
}

func newMeter() *meter { return &meter{outcomes: map[string]int{}} }

func (m *meter) TracePublishStart(ctx context.Context, _ []*kgo.Record) context.Context { return ctx }

func (m *meter) TracePublishEnd(_ context.Context, recs []*kgo.Record, res producer.PublishResult, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches++
	m.sent.Delivered += res.Delivered
	m.sent.Failed += res.Failed
	m.sent.Dead += res.Dead
	if err != nil || res.Failed > 0 {
		return
	}
	for _, r := range recs {
		for _, h := range r.Headers {
			if h.Key != outbox.HeaderOccurredAt {
				continue
			}
			if at, err := time.Parse(time.RFC3339Nano, string(h.Value)); err == nil {
				m.lag = append(m.lag, time.Since(at))
			}
		}
	}
}

type startKey struct{}

func (m *meter) TraceRecordStart(ctx context.Context, _ *kgo.Record) context.Context {
	return context.WithValue(ctx, startKey{}, time.Now())
}

func (m *meter) TraceRecordEnd(ctx context.Context, _ *kgo.Record, res consumer.Result, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	outcome := res.Outcome.String()
	if err != nil {
		outcome = "not done"
	}
	m.outcomes[outcome]++
	if start, ok := ctx.Value(startKey{}).(time.Time); ok {
		m.took = append(m.took, time.Since(start))
	}
}

// print writes what the meter saw.
func (m *meter) print(out io.Writer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintf(out, "measured: relay delivered %d, failed %d, dead %d, in %d batch(es); write-to-ack %s\n",
		m.sent.Delivered, m.sent.Failed, m.sent.Dead, m.batches, spread(m.lag))
	fmt.Fprintf(out, "measured: consumer %d applied, %d duplicate; per record %s\n",
		m.outcomes["applied"], m.outcomes["duplicate"], spread(m.took))
}

// spread describes durations by their median and maximum.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n/a"
	}
	s := slices.Sorted(slices.Values(ds))
	return fmt.Sprintf("median %s, max %s", s[len(s)/2].Round(time.Millisecond/10), s[len(s)-1].Round(time.Millisecond/10))
}
