package outboxotel_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/outboxotel"
)

// A record that carries the trace context of the request that wrote its
// event is processed in a span that continues that trace. In a service,
// set the same Options on producer.WriterConfig (NewPropagator) and
// producer.RelayConfig (NewRelayTracer).
func ExampleNewConsumerTracer() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()
	spans := tracetest.NewSpanRecorder()
	opts := &outboxotel.Options{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)), Propagator: propagation.TraceContext{}}
	tracer, err := outboxotel.NewConsumerTracer("billing", opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := consumer.Handle(db.Pool, "billing", consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		&consumer.Config{Schema: db.Schema, Tracer: tracer})
	if err != nil {
		fmt.Println(err)
		return
	}
	rec := &kgo.Record{Topic: "orders", Key: []byte("o-1"), Headers: []kgo.RecordHeader{
		{Key: outbox.HeaderEventID, Value: []byte("evt-1")},
		{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
	}}
	if _, err := p.Process(ctx, rec); err != nil {
		fmt.Println(err)
		return
	}
	s := spans.Ended()[0]
	fmt.Println(s.Name(), s.SpanKind())
	fmt.Println("trace:", s.SpanContext().TraceID())
	fmt.Println("parent:", s.Parent().SpanID())
	// Output:
	// process orders consumer
	// trace: 4bf92f3577b34da6a3ce929d0e0e4736
	// parent: 00f067aa0ba902b7
}
