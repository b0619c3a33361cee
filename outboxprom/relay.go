package outboxprom

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/producer"
)

// RelayMetrics measures a relay. It is a producer.RelayTracer, and a
// ClaimTracer, RebalanceTracer, ListenerTracer and PruneTracer: set it as
// producer.RelayConfig.Tracer. It is safe for concurrent use; one
// RelayMetrics serves one relay, since its gauges (the listener, the
// buckets) describe a single instance.
type RelayMetrics struct {
	delivered, failed, dead prometheus.Counter
	lag                     *prometheus.HistogramVec
	claimEvents             prometheus.Histogram
	claimDuration           prometheus.Histogram
	claimErrors             prometheus.Counter
	recordErrors            prometheus.Counter
	pruneErrors             prometheus.Counter
	listenerUp              prometheus.Gauge
	buckets                 prometheus.Gauge
	prunedRows              prometheus.Counter
	prunedPartitions        prometheus.Counter
}

var (
	_ producer.RelayTracer     = (*RelayMetrics)(nil)
	_ producer.ClaimTracer     = (*RelayMetrics)(nil)
	_ producer.RebalanceTracer = (*RelayMetrics)(nil)
	_ producer.ListenerTracer  = (*RelayMetrics)(nil)
	_ producer.PruneTracer     = (*RelayMetrics)(nil)
)

// lagBuckets reach from a relay woken by the commit (milliseconds) to a
// backlog that is alerted on (minutes).
var lagBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// claimBuckets reach RelayConfig.BatchSize's default of 1000 and beyond.
var claimBuckets = []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000}

// NewRelayMetrics registers a relay's metrics on reg and returns them;
// names.go lists them. It fails, registering nothing, when reg refuses
// one, such as a second RelayMetrics on the same registry.
func NewRelayMetrics(reg prometheus.Registerer) (*RelayMetrics, error) {
	events := prometheus.NewCounterVec(prometheus.CounterOpts{Name: RelayEvents,
		Help: "Events the relay published, by outcome: delivered, failed (not acknowledged; retried) and dead (failed for the last time, also counted as failed)."},
		[]string{LabelOutcome})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: RelayErrors,
		Help: "Relay operations that failed, by operation: claim, record (a batch's outcome not written back; published again after its lease) and prune."},
		[]string{LabelOperation})
	m := &RelayMetrics{
		delivered: events.WithLabelValues(outcomeDelivered),
		failed:    events.WithLabelValues(outcomeFailed),
		dead:      events.WithLabelValues(outcomeDead),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: RelayPublishLag,
			Help:    "Time from an event's outbox-occurred-at header to the end of the batch that delivered it, over batches without a failure.",
			Buckets: lagBuckets}, []string{LabelTopic}),
		claimEvents: prometheus.NewHistogram(prometheus.HistogramOpts{Name: RelayClaimEvents,
			Help: "Events a claim took, over claims that took any.", Buckets: claimBuckets}),
		claimDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: RelayClaimDuration,
			Help: "Time a claim took, empty ones included.", Buckets: prometheus.DefBuckets}),
		claimErrors:  errs.WithLabelValues(operationClaim),
		recordErrors: errs.WithLabelValues(operationRecord),
		pruneErrors:  errs.WithLabelValues(operationPrune),
		listenerUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: RelayListenerUp,
			Help: "1 while the relay's LISTEN session is up, 0 before it first connected and after it went down."}),
		buckets: prometheus.NewGauge(prometheus.GaugeOpts{Name: RelayBucketsOwned,
			Help: "Buckets the relay owned after its last rebalance, of 64."}),
		prunedRows: prometheus.NewCounter(prometheus.CounterOpts{Name: RelayPrunedRows,
			Help: "Delivered events pruned from a plain events table."}),
		prunedPartitions: prometheus.NewCounter(prometheus.CounterOpts{Name: RelayPrunedPartitions,
			Help: "Day partitions dropped from a partitioned events table."}),
	}
	err := register(reg, "NewRelayMetrics", events, errs, m.lag, m.claimEvents, m.claimDuration,
		m.listenerUp, m.buckets, m.prunedRows, m.prunedPartitions)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// TracePublishStart returns ctx: the batch's measures are taken at its end.
func (m *RelayMetrics) TracePublishStart(ctx context.Context, _ []*kgo.Record) context.Context {
	return ctx
}

// TracePublishEnd counts the batch's events by outcome and, when none
// failed, observes each record's publish lag. A batch with a failure is
// left out of the lag, since PublishResult does not say which of its
// records were delivered: the lag of a topic that fails now and then is
// measured on its batches that did not. A batch whose outcome could not
// be recorded (err not nil) counts one record error and no events: they
// are published again after their lease and counted then.
func (m *RelayMetrics) TracePublishEnd(_ context.Context, recs []*kgo.Record, res producer.PublishResult, err error) {
	if err != nil {
		m.recordErrors.Inc()
		return
	}
	m.delivered.Add(float64(res.Delivered))
	m.failed.Add(float64(res.Failed))
	m.dead.Add(float64(res.Dead))
	if res.Failed > 0 {
		return
	}
	now := time.Now()
	for _, r := range recs {
		if at, ok := occurredAt(r); ok {
			m.lag.WithLabelValues(r.Topic).Observe(nonNegative(now.Sub(at)))
		}
	}
}

type claimStartKey struct{}

// TraceClaimStart notes when the claim started.
func (m *RelayMetrics) TraceClaimStart(ctx context.Context) context.Context {
	return context.WithValue(ctx, claimStartKey{}, time.Now())
}

// TraceClaimEnd observes the claim's duration and, when it took events,
// their number; a failed claim counts a claim error instead.
func (m *RelayMetrics) TraceClaimEnd(ctx context.Context, n int, err error) {
	if start, ok := ctx.Value(claimStartKey{}).(time.Time); ok {
		m.claimDuration.Observe(time.Since(start).Seconds())
	}
	switch {
	case err != nil:
		m.claimErrors.Inc()
	case n > 0:
		m.claimEvents.Observe(float64(n))
	}
}

// TraceRebalance sets the buckets owned after a rebalance that succeeded;
// one that failed leaves the gauge as it was, since the relay keeps the
// buckets it holds.
func (m *RelayMetrics) TraceRebalance(_ context.Context, owned, _ int, err error) {
	if err == nil {
		m.buckets.Set(float64(owned))
	}
}

// TraceListener sets the listener gauge. It keeps its last value after
// the relay's Run returns.
func (m *RelayMetrics) TraceListener(_ context.Context, up bool, _ error) {
	m.listenerUp.Set(boolValue(up))
}

// TracePrune counts what a prune removed and, when it failed, a prune
// error: a prune that fails part way has committed the chunks before.
func (m *RelayMetrics) TracePrune(_ context.Context, res producer.PruneResult, err error) {
	if err != nil {
		m.pruneErrors.Inc()
	}
	m.prunedRows.Add(float64(res.Deleted))
	m.prunedPartitions.Add(float64(res.PartitionsDropped))
}

// occurredAt returns the time in r's outbox-occurred-at header.
func occurredAt(r *kgo.Record) (time.Time, bool) {
	for _, h := range r.Headers {
		if h.Key == outbox.HeaderOccurredAt {
			at, err := time.Parse(time.RFC3339Nano, string(h.Value))
			return at, err == nil
		}
	}
	return time.Time{}, false
}

// nonNegative returns d in seconds, or 0 for a negative d: a lag across
// hosts whose clocks disagree.
func nonNegative(d time.Duration) float64 {
	return max(d, 0).Seconds()
}
