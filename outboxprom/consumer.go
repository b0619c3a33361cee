package outboxprom

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
)

// ConsumerMetrics measures one consumer's records. It is a consumer.Tracer:
// set it as consumer.Config.Tracer of the consumer it was made for (a
// Processor's batches end in per-record calls too, so it needs no batch
// hooks). It is safe for concurrent use.
type ConsumerMetrics struct {
	records  *prometheus.CounterVec
	duration *prometheus.HistogramVec
	lag      *prometheus.HistogramVec
}

var _ consumer.Tracer = (*ConsumerMetrics)(nil)

// NewConsumerMetrics registers the metrics of the consumer called name (as
// given to consumer.New or consumer.Handle) on reg and returns them;
// names.go lists them, each labelled consumer=name. Consumers of other
// names may share reg. It fails, registering nothing, when name is empty
// or reg refuses a metric, such as a second ConsumerMetrics of one name.
func NewConsumerMetrics(reg prometheus.Registerer, name string) (*ConsumerMetrics, error) {
	if name == "" {
		return nil, errors.New("outboxprom: NewConsumerMetrics needs the consumer's name; got \"\"")
	}
	constLabels := prometheus.Labels{LabelConsumer: name}
	m := &ConsumerMetrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ConsumerRecords, ConstLabels: constLabels,
			Help: "Records the consumer was done with (applied, duplicate, parked, dead_lettered) or handed back (not_done), by topic and outcome."},
			[]string{LabelTopic, LabelOutcome}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: ConsumerProcessDuration, ConstLabels: constLabels,
			Help:    "Time from a record's start to its end, retries and backoff included, whatever its outcome.",
			Buckets: prometheus.DefBuckets}, []string{LabelTopic}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: ConsumerApplyLag, ConstLabels: constLabels,
			Help:    "Time from an applied record's outbox-occurred-at header (else its Kafka timestamp) to the end of its processing.",
			Buckets: lagBuckets}, []string{LabelTopic}),
	}
	if err := register(reg, "NewConsumerMetrics", m.records, m.duration, m.lag); err != nil {
		return nil, err
	}
	return m, nil
}

type recordStartKey struct{}

// TraceRecordStart notes when the record started, in the context its end
// is called with.
func (m *ConsumerMetrics) TraceRecordStart(ctx context.Context, _ *kgo.Record) context.Context {
	return context.WithValue(ctx, recordStartKey{}, time.Now())
}

// TraceRecordEnd counts the record's outcome (not_done when err is not
// nil), observes its processing time and, when it was applied, its apply
// lag. A parked record that is applied later, when its gap fills, is
// counted once, as parked, and its lag is not observed.
func (m *ConsumerMetrics) TraceRecordEnd(ctx context.Context, rec *kgo.Record, res consumer.Result, err error) {
	now := time.Now()
	outcome := res.Outcome.String()
	if err != nil {
		outcome = outcomeNotDone
	}
	m.records.WithLabelValues(rec.Topic, outcome).Inc()
	if start, ok := ctx.Value(recordStartKey{}).(time.Time); ok {
		m.duration.WithLabelValues(rec.Topic).Observe(now.Sub(start).Seconds())
	}
	if err != nil || res.Outcome != consumer.Applied {
		return
	}
	at, ok := occurredAt(rec)
	if !ok {
		at, ok = rec.Timestamp, !rec.Timestamp.IsZero()
	}
	if ok {
		m.lag.WithLabelValues(rec.Topic).Observe(nonNegative(now.Sub(at)))
	}
}
