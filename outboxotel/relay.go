package outboxotel

import (
	"context"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/d419a114/outbox/producer"
)

// RelayTracer is a producer.RelayTracer (and ClaimTracer): each batch the
// relay publishes gets a send span, of kind producer, linked to the spans
// that wrote its events, and each claim that took events (or failed) a
// span of its own; the instruments
// messaging.client.operation.duration and messaging.client.sent.messages
// measure the sends.
type RelayTracer struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	duration metric.Float64Histogram
	sent     metric.Int64Counter
}

var (
	_ producer.RelayTracer = (*RelayTracer)(nil)
	_ producer.ClaimTracer = (*RelayTracer)(nil)
)

// NewRelayTracer returns a RelayTracer for RelayConfig.Tracer.
func NewRelayTracer(opts *Options) (*RelayTracer, error) {
	o := opts.withDefaults()
	m := o.MeterProvider.Meter(scope)
	duration, err := m.Float64Histogram(metricOperationDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of the relay's sends of a batch, from the first record produced to the outcome recorded."))
	if err != nil {
		return nil, err
	}
	sent, err := m.Int64Counter(metricSentMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Records the relay sent and the broker acknowledged."))
	if err != nil {
		return nil, err
	}
	return &RelayTracer{tracer: o.TracerProvider.Tracer(scope), prop: o.Propagator, duration: duration, sent: sent}, nil
}

type startKey struct{}

// TracePublishStart starts the batch's send span.
func (t *RelayTracer) TracePublishStart(ctx context.Context, recs []*kgo.Record) context.Context {
	links := carried(t.prop, recs)
	attrs := []attribute.KeyValue{keySystem.String(systemKafka), keyOperationName.String(opSend),
		keyOperationType.String(opSend), keyBatchCount.Int(len(recs))}
	name := opSend
	if topic := oneTopic(recs); topic != "" {
		attrs = append(attrs, keyDestination.String(topic))
		name += " " + topic
	}
	ctx, _ = t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(links...), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, startKey{}, time.Now())
}

// TracePublishEnd ends the send span with the batch's counts.
func (t *RelayTracer) TracePublishEnd(ctx context.Context, recs []*kgo.Record, res producer.PublishResult, err error) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(keyPublishedDelivered.Int(res.Delivered), keyPublishedFailed.Int(res.Failed), keyPublishedDead.Int(res.Dead))
	base := []attribute.KeyValue{keySystem.String(systemKafka), keyOperationName.String(opSend)}
	if topic := oneTopic(recs); topic != "" {
		base = append(base, keyDestination.String(topic))
	}
	measured := base
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		measured = append(slices.Clip(base), keyErrorType.String("unrecorded"))
	case res.Failed > 0:
		span.SetStatus(codes.Error, "some records were not acknowledged")
		measured = append(slices.Clip(base), keyErrorType.String("not_acknowledged"))
	}
	span.End()
	if start, ok := ctx.Value(startKey{}).(time.Time); ok {
		t.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(measured...))
	}
	t.sent.Add(ctx, int64(res.Delivered), metric.WithAttributes(base...))
}

type claimStartKey struct{}

// TraceClaimStart notes when the claim started. The claim's span is made
// at its end, and only for a claim that took events or failed: an idle
// relay claims nothing every PollInterval, and a root span for each of
// those would bury the ones that matter.
func (t *RelayTracer) TraceClaimStart(ctx context.Context) context.Context {
	return context.WithValue(ctx, claimStartKey{}, time.Now())
}

// TraceClaimEnd records the claim's span, from its start to now, with the
// number of events claimed; none for an empty claim without error.
func (t *RelayTracer) TraceClaimEnd(ctx context.Context, n int, err error) {
	start, ok := ctx.Value(claimStartKey{}).(time.Time)
	if !ok || n == 0 && err == nil {
		return
	}
	_, span := t.tracer.Start(ctx, "outbox "+opClaim, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(start), trace.WithAttributes(keyClaimed.Int(n)))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// carried returns a link to each valid trace context recs carry.
func carried(prop propagation.TextMapPropagator, recs []*kgo.Record) []trace.Link {
	var links []trace.Link
	for _, r := range recs {
		if sc := trace.SpanContextFromContext(prop.Extract(context.Background(), headers{r})); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}

// oneTopic returns the topic of recs when they share one, else "".
func oneTopic(recs []*kgo.Record) string {
	if len(recs) == 0 {
		return ""
	}
	for _, r := range recs[1:] {
		if r.Topic != recs[0].Topic {
			return ""
		}
	}
	return recs[0].Topic
}
