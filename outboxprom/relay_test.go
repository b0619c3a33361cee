package outboxprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/outboxprom"
	"github.com/d419a114/outbox/producer"
)

// After 20 events delivered and one the broker refuses as too large, three
// times and then dead, the registry counts exactly those, the lag of the
// delivered ones, every claimed event, the listener up, the buckets of the
// only relay and the delivered rows pruned, and no error.
func TestRelayMetrics(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, nil)
	broker := kafkatest.NewFake(t)
	topic, poisonTopic := broker.Topic(t, 2), broker.Topic(t, 1)
	broker.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: poisonTopic, Err: kerr.MessageTooLarge, Count: -1})
	reg := prometheus.NewPedanticRegistry()
	m, err := outboxprom.NewRelayMetrics(reg)
	require.NoError(t, err)
	startRelay(t, db, broker, producer.RelayConfig{Tracer: m, MaxAttempts: 3, MinBackoff: time.Millisecond,
		MaxBackoff: 5 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		Retention: time.Millisecond, RetentionInterval: 50 * time.Millisecond})

	// The poison event comes after the others are delivered, so that no
	// batch with a failure holds one of theirs: those are left out of the
	// lag.
	write(t, db, events(topic, 20)...)
	eventually.True(t, 30*time.Second, func() bool {
		return value(t, reg, outboxprom.RelayEvents, "outcome", "delivered") == 20
	}, "20 events delivered")
	poison := events(poisonTopic, 1)
	poison[0].AggregateID = "sick"
	write(t, db, poison...)
	eventually.True(t, 30*time.Second, func() bool {
		return value(t, reg, outboxprom.RelayEvents, "outcome", "dead") == 1 &&
			value(t, reg, outboxprom.RelayPrunedRows) == 20
	}, "the poison event dead and the delivered ones pruned")

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP outbox_relay_events_total Events the relay published, by outcome: delivered, failed (not acknowledged; retried) and dead (failed for the last time, also counted as failed).
# TYPE outbox_relay_events_total counter
outbox_relay_events_total{outcome="dead"} 1
outbox_relay_events_total{outcome="delivered"} 20
outbox_relay_events_total{outcome="failed"} 3
# HELP outbox_relay_errors_total Relay operations that failed, by operation: claim, record (a batch's outcome not written back; published again after its lease) and prune.
# TYPE outbox_relay_errors_total counter
outbox_relay_errors_total{operation="claim"} 0
outbox_relay_errors_total{operation="prune"} 0
outbox_relay_errors_total{operation="record"} 0
# HELP outbox_relay_listener_up 1 while the relay's LISTEN session is up, 0 before it first connected and after it went down.
# TYPE outbox_relay_listener_up gauge
outbox_relay_listener_up 1
# HELP outbox_relay_buckets_owned Buckets the relay owned after its last rebalance, of 64.
# TYPE outbox_relay_buckets_owned gauge
outbox_relay_buckets_owned 64
# HELP outbox_relay_pruned_rows_total Delivered events pruned from a plain events table.
# TYPE outbox_relay_pruned_rows_total counter
outbox_relay_pruned_rows_total 20
# HELP outbox_relay_pruned_partitions_total Day partitions dropped from a partitioned events table.
# TYPE outbox_relay_pruned_partitions_total counter
outbox_relay_pruned_partitions_total 0
`), outboxprom.RelayEvents, outboxprom.RelayErrors, outboxprom.RelayListenerUp, outboxprom.RelayBucketsOwned,
		outboxprom.RelayPrunedRows, outboxprom.RelayPrunedPartitions))

	n, sum := histogram(t, reg, outboxprom.RelayPublishLag, "topic", topic)
	require.EqualValues(t, 20, n, "the lag of every delivered event")
	require.Positive(t, sum)
	n, _ = histogram(t, reg, outboxprom.RelayPublishLag, "topic", poisonTopic)
	require.Zero(t, n, "no lag for an event never delivered")
	claims, claimed := histogram(t, reg, outboxprom.RelayClaimEvents)
	require.EqualValues(t, 23, claimed, "20 events and the poison one three times")
	require.GreaterOrEqual(t, claims, uint64(4), "the poison event in three claims of its own")
	timed, _ := histogram(t, reg, outboxprom.RelayClaimDuration)
	require.GreaterOrEqual(t, timed, claims, "every claim timed, empty ones too")
}

// A second RelayMetrics on one registry is refused, and so is one whose
// metric is taken by another collector; a refused one leaves none of its
// metrics behind, so that it can be registered once the other is gone.
func TestNewRelayMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	_, err := outboxprom.NewRelayMetrics(reg)
	require.NoError(t, err)
	_, err = outboxprom.NewRelayMetrics(reg)
	require.ErrorContains(t, err, "register metrics")
	_, err = outboxprom.NewRelayMetrics(nil)
	require.ErrorContains(t, err, "Registerer")

	other := prometheus.NewRegistry()
	squatter := prometheus.NewGauge(prometheus.GaugeOpts{Name: outboxprom.RelayBucketsOwned, Help: "Buckets the relay owned after its last rebalance, of 64."})
	require.NoError(t, other.Register(squatter))
	_, err = outboxprom.NewRelayMetrics(other)
	require.ErrorContains(t, err, "register metrics")
	require.True(t, other.Unregister(squatter))
	_, err = outboxprom.NewRelayMetrics(other)
	require.NoError(t, err, "nothing left of the refused one")
}
