package outboxprom_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/outboxprom"
	"github.com/d419a114/outbox/producer"
)

// TestForShard: the collectors of several shards register on one registry
// through ForShard, and each series carries its shard; the relay and
// consumer metrics of each shard are apart too. A registry without
// ForShard is as before (the other tests).
func TestForShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	dbs := map[string]*pgtest.DB{"a": pgtest.New(t, nil), "b": pgtest.New(t, nil)}
	write(t, dbs["b"], producer.Event{Topic: "orders", AggregateType: "order", AggregateID: "o-1", EventType: "order.placed", Payload: []byte(`{}`)})
	relays := map[string]*outboxprom.RelayMetrics{}
	for name, db := range dbs {
		sr, err := outboxprom.ForShard(reg, name)
		require.NoError(t, err)
		h, err := outboxprom.NewHealthCollector(db.Pool, &outboxprom.HealthConfig{Schema: db.Schema, Consumers: []string{"billing"}, Logger: quiet})
		require.NoError(t, err)
		require.NoError(t, sr.Register(h))
		relays[name], err = outboxprom.NewRelayMetrics(sr)
		require.NoError(t, err)
		_, err = outboxprom.NewConsumerMetrics(sr, "billing")
		require.NoError(t, err, "one consumer name on several targets")
	}
	require.Zero(t, value(t, reg, outboxprom.EventsUndelivered, outboxprom.LabelShard, "a"))
	require.Equal(t, 1.0, value(t, reg, outboxprom.EventsUndelivered, outboxprom.LabelShard, "b"))
	require.Equal(t, 1.0, value(t, reg, outboxprom.HealthUp, outboxprom.LabelShard, "a", "source", "consumer", "name", "billing"))
	relays["a"].TraceListener(ctx, true, nil)
	relays["b"].TraceListener(ctx, false, nil)
	require.Equal(t, 1.0, value(t, reg, outboxprom.RelayListenerUp, outboxprom.LabelShard, "a"))
	require.Zero(t, value(t, reg, outboxprom.RelayListenerUp, outboxprom.LabelShard, "b"))
	for _, name := range []string{outboxprom.EventsUndelivered, outboxprom.RelayListenerUp} {
		for _, s := range series(t, reg, name) {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			require.Contains(t, []string{"a", "b"}, labels[outboxprom.LabelShard], "%s: every series has its shard", name)
		}
	}

	sr, err := outboxprom.ForShard(reg, "a")
	require.NoError(t, err)
	_, err = outboxprom.NewRelayMetrics(sr)
	require.ErrorContains(t, err, "register metrics", "a shard's metrics register once")
	_, err = outboxprom.ForShard(reg, "")
	require.EqualError(t, err, `outboxprom: ForShard: shard name "" is not a label value: give the shard's name (shard.Shard.Name)`)
	_, err = outboxprom.ForShard(nil, "a")
	require.ErrorContains(t, err, "needs a prometheus.Registerer")
}
