package outboxotel

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
)

// ConsumerTracer is a consumer.Tracer (and BatchTracer): each record gets
// a process span, of kind consumer, whose parent is the trace context the
// record carries (the span that wrote the event), or which links to it
// with Options.LinkToProducer; the record's transaction and handler run
// inside it. A batch gets a process span linked to its records'. The
// instruments messaging.process.duration and
// messaging.client.consumed.messages measure the records.
type ConsumerTracer struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	link     bool
	group    string
	duration metric.Float64Histogram
	consumed metric.Int64Counter
}

var _ consumer.BatchTracer = (*ConsumerTracer)(nil)

// NewConsumerTracer returns a ConsumerTracer for Config.Tracer; group is
// the consumer name given to consumer.New or consumer.Handle.
func NewConsumerTracer(group string, opts *Options) (*ConsumerTracer, error) {
	o := opts.withDefaults()
	m := o.MeterProvider.Meter(scope)
	duration, err := m.Float64Histogram(metricProcessDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of a record's processing: claim, order, handler and commit."))
	if err != nil {
		return nil, err
	}
	consumed, err := m.Int64Counter(metricConsumedMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Records the consumer was done with (applied, duplicate, parked or dead-lettered)."))
	if err != nil {
		return nil, err
	}
	return &ConsumerTracer{tracer: o.TracerProvider.Tracer(scope), prop: o.Propagator, link: o.LinkToProducer,
		group: group, duration: duration, consumed: consumed}, nil
}

// TraceRecordStart starts the record's process span.
func (t *ConsumerTracer) TraceRecordStart(ctx context.Context, rec *kgo.Record) context.Context {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		keySystem.String(systemKafka), keyOperationName.String(opProcess), keyOperationType.String(opProcess),
		keyDestination.String(rec.Topic), keyPartition.String(strconv.Itoa(int(rec.Partition))),
		keyOffset.Int64(rec.Offset), keyConsumerGroup.String(t.group), keyMessageKey.String(string(rec.Key)))}
	if id := (headers{rec}).Get(outbox.HeaderEventID); id != "" {
		opts = append(opts, trace.WithAttributes(keyMessageID.String(id)))
	}
	parent := ctx
	if t.link {
		if sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), headers{rec})); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}), trace.WithNewRoot())
		}
	} else {
		parent = t.prop.Extract(ctx, headers{rec})
	}
	ctx, _ = t.tracer.Start(parent, opProcess+" "+rec.Topic, opts...)
	return context.WithValue(ctx, startKey{}, time.Now())
}

// TraceRecordEnd ends the record's process span with its outcome.
func (t *ConsumerTracer) TraceRecordEnd(ctx context.Context, rec *kgo.Record, res consumer.Result, err error) {
	span := trace.SpanFromContext(ctx)
	attrs := []attribute.KeyValue{keySystem.String(systemKafka), keyOperationName.String(opProcess),
		keyDestination.String(rec.Topic), keyConsumerGroup.String(t.group)}
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(keyOutcome.String("not_done"))
		attrs = append(attrs, keyErrorType.String("not_done"))
	case res.Outcome == consumer.DeadLettered:
		span.SetAttributes(keyOutcome.String(res.Outcome.String()), keyDeadLetterID.Int64(res.DeadLetterID))
		if res.Err != nil {
			span.RecordError(res.Err)
		}
		span.SetStatus(codes.Error, "dead-lettered")
		attrs = append(attrs, keyErrorType.String("dead_lettered"))
	default:
		span.SetAttributes(keyOutcome.String(res.Outcome.String()))
	}
	span.End()
	if start, ok := ctx.Value(startKey{}).(time.Time); ok {
		t.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrs...))
	}
	if err == nil {
		t.consumed.Add(ctx, 1, metric.WithAttributes(attrs...))
	}
}

// TraceBatchStart starts the batch's process span, linked to the trace
// contexts its records carry.
func (t *ConsumerTracer) TraceBatchStart(ctx context.Context, recs []*kgo.Record) context.Context {
	links := carried(t.prop, recs)
	attrs := []attribute.KeyValue{keySystem.String(systemKafka), keyOperationName.String(opProcess),
		keyOperationType.String(opProcess), keyConsumerGroup.String(t.group), keyBatchCount.Int(len(recs))}
	name := opProcess
	if topic := oneTopic(recs); topic != "" {
		attrs = append(attrs, keyDestination.String(topic))
		name += " " + topic
		if len(recs) > 0 {
			attrs = append(attrs, keyPartition.String(strconv.Itoa(int(recs[0].Partition))))
		}
	}
	ctx, _ = t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...), trace.WithAttributes(attrs...))
	return ctx
}

// TraceBatchEnd ends the batch's span; its records' spans carry their
// outcomes.
func (t *ConsumerTracer) TraceBatchEnd(ctx context.Context, _ []*kgo.Record, _ []consumer.Result, err error) {
	span := trace.SpanFromContext(ctx)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
