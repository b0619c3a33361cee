package outboxprom_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/outboxprom"
)

// After records that are applied, duplicate, parked, dead-lettered and
// handed back, the registry counts each outcome by topic, times every
// record, and observes the apply lag of the applied ones from their
// occurred-at header or, without one, their Kafka timestamp.
func TestConsumerMetrics(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, nil)
	reg := prometheus.NewPedanticRegistry()
	m, err := outboxprom.NewConsumerMetrics(reg, "svc")
	require.NoError(t, err)
	p, err := consumer.Handle(db.Pool, "svc", failingHandler, &consumer.Config{Schema: db.Schema, Tracer: m,
		MaxAttempts: 2, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)

	ctx := context.Background()
	written := time.Now().Add(-time.Minute)
	process := func(ctx context.Context, r *kgo.Record, want consumer.Outcome) {
		t.Helper()
		res, err := p.Process(ctx, r)
		require.NoError(t, err)
		require.Equal(t, want, res.Outcome, "outcome of %s", r.Headers[0].Value)
	}
	process(ctx, rec("orders", "a", 1, "a1", written), consumer.Applied)
	process(ctx, rec("orders", "a", 1, "a1", written), consumer.Duplicate)
	process(ctx, rec("orders", "a", 3, "a3", written), consumer.Parked)
	process(ctx, rec("orders", "a", 2, "a2", written), consumer.Applied) // and a3 with it
	process(ctx, rec("orders", "p", 1, "p1", written), consumer.DeadLettered)
	process(ctx, rec("orders", "p", 2, "p2", written), consumer.Parked) // behind p1's letter
	stamped := rec("payments", "b", 1, "b1", time.Time{})
	stamped.Timestamp = written
	process(ctx, stamped, consumer.Applied)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = p.Process(canceled, rec("payments", "c", 1, "c1", written))
	require.Error(t, err, "a record of a canceled context is handed back")

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP outbox_consumer_records_total Records the consumer was done with (applied, duplicate, parked, dead_lettered) or handed back (not_done), by topic and outcome.
# TYPE outbox_consumer_records_total counter
outbox_consumer_records_total{consumer="svc",outcome="applied",topic="orders"} 2
outbox_consumer_records_total{consumer="svc",outcome="applied",topic="payments"} 1
outbox_consumer_records_total{consumer="svc",outcome="dead_lettered",topic="orders"} 1
outbox_consumer_records_total{consumer="svc",outcome="duplicate",topic="orders"} 1
outbox_consumer_records_total{consumer="svc",outcome="not_done",topic="payments"} 1
outbox_consumer_records_total{consumer="svc",outcome="parked",topic="orders"} 2
`), outboxprom.ConsumerRecords))

	n, _ := histogram(t, reg, outboxprom.ConsumerProcessDuration, "topic", "orders")
	require.EqualValues(t, 6, n, "every record of orders timed")
	n, _ = histogram(t, reg, outboxprom.ConsumerProcessDuration, "topic", "payments")
	require.EqualValues(t, 2, n, "every record of payments timed, the one handed back too")
	for topic, applied := range map[string]int{"orders": 2, "payments": 1} {
		n, sum := histogram(t, reg, outboxprom.ConsumerApplyLag, "consumer", "svc", "topic", topic)
		require.EqualValues(t, applied, n, "lag of %s's applied records", topic)
		require.GreaterOrEqual(t, sum, float64(applied)*60, "each was written a minute ago")
		require.Less(t, sum, float64(applied)*(60+30), "and applied within the test")
	}
}

// Consumers of different names share a registry; a second ConsumerMetrics
// of one name, and one without a name, are refused.
func TestNewConsumerMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	_, err := outboxprom.NewConsumerMetrics(reg, "billing")
	require.NoError(t, err)
	_, err = outboxprom.NewConsumerMetrics(reg, "shipping")
	require.NoError(t, err)
	_, err = outboxprom.NewConsumerMetrics(reg, "billing")
	require.ErrorContains(t, err, "register metrics")
	_, err = outboxprom.NewConsumerMetrics(reg, "")
	require.ErrorContains(t, err, "name")
	_, err = outboxprom.NewConsumerMetrics(nil, "billing")
	require.ErrorContains(t, err, "Registerer")
}
