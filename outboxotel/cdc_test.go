package outboxotel_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/outboxotel"
)

// A record Debezium published carries the event's headers, traceparent
// among them, as one JSON header: its process span continues the trace all
// the same.
func TestCDCRecordContinuesItsTrace(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, nil)
	spans := tracetest.NewSpanRecorder()
	opts := &outboxotel.Options{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)), Propagator: propagation.TraceContext{}}
	tracer, err := outboxotel.NewConsumerTracer("billing", opts)
	require.NoError(t, err)
	p, err := consumer.Handle(db.Pool, "billing", consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		&consumer.Config{Schema: db.Schema, Tracer: tracer})
	require.NoError(t, err)
	_, err = p.Process(context.Background(), &kgo.Record{Topic: "orders", Key: []byte("o-1"), Headers: []kgo.RecordHeader{
		{Key: outbox.HeaderEventID, Value: []byte("evt-1")},
		{Key: outbox.HeaderCDCHeaders, Value: []byte(`{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`)},
	}})
	require.NoError(t, err)
	s := spans.Ended()[0]
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.SpanContext().TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", s.Parent().SpanID().String())
}
