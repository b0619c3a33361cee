package outboxotel_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/outboxotel"
	"github.com/d419a114/outbox/producer"
)

// One trace runs from a request's span through Write, the relay's send
// span (linked to it) and the consumer's process span (its child), and
// the handler's transaction runs inside the process span, which carries
// the record's partition, offset and group. A write that rolls back is
// never sent, so no send span links to its request.
func TestOneTraceFromRequestToHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	metrics := sdkmetric.NewManualReader()
	// No Propagator: the default links the traces (no test of this
	// package sets the global one).
	opts := &outboxotel.Options{TracerProvider: tp, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(metrics))}
	db := pgtest.New(t, nil)
	broker := kafkatest.New(t)
	topic := broker.Topic(t, 2)
	w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema, Propagator: outboxotel.NewPropagator(opts)})
	write := func(name string, commit bool) trace.SpanContext {
		rctx, req := tp.Tracer("test").Start(ctx, name)
		defer req.End()
		tx, err := db.Pool.Begin(rctx)
		require.NoError(t, err)
		_, err = w.Write(rctx, tx, producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "placed", Topic: topic, Payload: []byte(name)})
		require.NoError(t, err)
		if commit {
			require.NoError(t, tx.Commit(rctx))
		} else {
			require.NoError(t, tx.Rollback(rctx))
		}
		return req.SpanContext()
	}
	rolledBack := write("rolled back request", false)
	request := write("request", true)

	rt, err := outboxotel.NewRelayTracer(opts)
	require.NoError(t, err)
	relay, err := producer.NewRelay(db.Pool, broker.Client(t), &producer.RelayConfig{Schema: db.Schema, Tracer: rt, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	published := broker.Records(t, topic, 1, 30*time.Second)
	require.Len(t, published, 1)

	ct, err := outboxotel.NewConsumerTracer("billing", opts)
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		inSpans []trace.SpanContext
	)
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		inSpans = append(inSpans, trace.SpanContextFromContext(ctx))
		return nil
	})
	cl := broker.Client(t, append([]kgo.Opt{kgo.ConsumerGroup("billing-" + topic), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, consumer.ClientOpts()...)...)
	c, err := consumer.New(db.Pool, cl, "billing", h, &consumer.Config{Schema: db.Schema, Tracer: ct})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	eventually.True(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(inSpans) == 1
	}, "the handler ran")
	stop()
	require.NoError(t, <-done)
	stopRelay()
	<-relayDone

	var send, process sdktrace.ReadOnlySpan
	claims := 0
	for _, s := range spans.Ended() {
		switch s.Name() {
		case "outbox claim":
			claims++
			for _, kv := range s.Attributes() {
				if kv.Key == "outbox.relay.claimed" {
					require.Positive(t, kv.Value.AsInt64(), "a claim span for an idle poll")
				}
			}
		case "send " + topic:
			for _, l := range s.Links() {
				require.NotEqual(t, rolledBack.TraceID(), l.SpanContext.TraceID(), "a send span links to the rolled-back write")
				if l.SpanContext.SpanID() == request.SpanID() {
					send = s
				}
			}
		case "process " + topic:
			process = s
		}
	}
	require.Equal(t, 1, claims, "one claim took the event; the idle polls around it make no span")
	require.NotNil(t, send, "no send span links to the request")
	require.Equal(t, trace.SpanKindProducer, send.SpanKind())
	require.NotNil(t, process, "no process span")
	require.Equal(t, trace.SpanKindConsumer, process.SpanKind())
	require.Equal(t, request.TraceID(), process.SpanContext().TraceID(), "the process span continues the request's trace")
	require.Equal(t, request.SpanID(), process.Parent().SpanID(), "the process span is the request span's child")
	require.Equal(t, process.SpanContext().SpanID(), inSpans[0].SpanID(), "the handler runs inside the process span")
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range process.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	require.Equal(t, strconv.Itoa(int(published[0].Partition)), attrs["messaging.destination.partition.id"].AsString())
	require.Equal(t, published[0].Offset, attrs["messaging.kafka.offset"].AsInt64())
	require.Equal(t, "billing", attrs["messaging.consumer.group.name"].AsString())
	require.Equal(t, "kafka", attrs["messaging.system"].AsString())
	require.Equal(t, "applied", attrs["outbox.consumer.outcome"].AsString())

	var rm metricdata.ResourceMetrics
	require.NoError(t, metrics.Collect(ctx, &rm))
	names := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names[m.Name] = true
		}
	}
	for _, want := range []string{"messaging.process.duration", "messaging.client.consumed.messages", "messaging.client.operation.duration", "messaging.client.sent.messages"} {
		require.True(t, names[want], "no %s", want)
	}
}

// With no Options, Write's events carry W3C traceparent, and a consumer's
// process span continues the trace it names: the global propagator of
// go.opentelemetry.io/otel, unset, would write nothing.
func TestZeroOptionsPropagateTraceContext(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	h := map[string]string{}
	outboxotel.NewPropagator(nil).Inject(ctx, h)
	require.Contains(t, h, "traceparent")
	require.Contains(t, h["traceparent"], span.SpanContext().TraceID().String())

	spans := tracetest.NewSpanRecorder()
	ct, err := outboxotel.NewConsumerTracer("billing", &outboxotel.Options{
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))})
	require.NoError(t, err)
	rec := &kgo.Record{Topic: "orders", Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte(h["traceparent"])}}}
	ct.TraceRecordEnd(ct.TraceRecordStart(context.Background(), rec), rec, consumer.Result{Outcome: consumer.Applied}, nil)
	require.Len(t, spans.Ended(), 1)
	require.Equal(t, span.SpanContext().TraceID(), spans.Ended()[0].SpanContext().TraceID())
	require.Equal(t, span.SpanContext().SpanID(), spans.Ended()[0].Parent().SpanID())

	// An empty propagator turns it off.
	off := map[string]string{}
	outboxotel.NewPropagator(&outboxotel.Options{Propagator: propagation.NewCompositeTextMapPropagator()}).Inject(ctx, off)
	require.Empty(t, off)
}

// A claim span is made for a claim that took events or failed, from the
// claim's start; an empty claim, every PollInterval of an idle relay,
// makes none.
func TestClaimSpanOnlyWhenClaimed(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewSpanRecorder()
	rt, err := outboxotel.NewRelayTracer(&outboxotel.Options{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))})
	require.NoError(t, err)
	claim := func(n int, err error) time.Time {
		start := time.Now()
		rt.TraceClaimEnd(rt.TraceClaimStart(context.Background()), n, err)
		return start
	}
	claim(0, nil)
	require.Empty(t, spans.Ended(), "an empty claim made a span")
	started := claim(3, nil)
	claim(0, errors.New("connection refused"))
	ended := spans.Ended()
	require.Len(t, ended, 2)
	require.Equal(t, "outbox claim", ended[0].Name())
	require.False(t, ended[0].StartTime().Before(started), "the span starts when the claim did")
	require.Contains(t, ended[0].Attributes(), attribute.Int("outbox.relay.claimed", 3))
	require.Equal(t, codes.Error, ended[1].Status().Code)
}
