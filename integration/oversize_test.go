package integration

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/producer"
)

// TestScenarioOversizedEventHoldsItsAggregate checks, on the broker the
// suite runs (a real one in CI), that an event too large for the relay's
// client never lets a later event of its aggregate onto the topic: not one
// in the same batch, not one written later. It goes dead and holds its
// aggregate; another aggregate flows; after a discard the held events go
// out in order.
func TestScenarioOversizedEventHoldsItsAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newScenario(t, scenarioRand(t), kafkatest.New(t), 1)
	const clientMax = 16 << 10
	s.writer = producer.NewWriter(&producer.WriterConfig{Schema: s.db.Schema, MaxRecordBytes: 4 * clientMax})
	big := s.event("x")
	big.Payload = bytes.Repeat([]byte("p"), 2*clientMax)
	_, ok := s.attempt([]producer.Event{big, s.event("x"), s.event("y")}, false)
	require.True(t, ok)
	cfg := scenarioRelayConfig()
	cfg.MaxRecordBytes, cfg.MaxAttempts = clientMax, 2
	s.startRelay("a", cfg, nil, kgo.ProducerBatchMaxBytes(clientMax))

	dead, err := producer.NewDeadEvents(&producer.DeadEventsConfig{Schema: s.db.Schema})
	require.NoError(t, err)
	in, err := producer.NewInspector(s.db.Pool, s.db.Schema)
	require.NoError(t, err)
	var list []producer.DeadEvent
	waitUntil(t, 60*time.Second, "the oversized event dead", func() bool {
		list, err = in.DeadEvents(ctx, &deadletter.ListOpts{Status: deadletter.StatusDead})
		require.NoError(t, err)
		return len(list) == 1
	})
	require.Equal(t, int64(1), list[0].Seq)
	_, ok = s.attempt([]producer.Event{s.event("x")}, false)
	require.True(t, ok)
	_, ok = s.attempt([]producer.Event{s.event("y")}, false)
	require.True(t, ok)
	undelivered := func(agg string) int {
		var n int
		require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s.db.Table("events")+
			` WHERE published_at IS NULL AND aggregate_id = $1`, agg).Scan(&n))
		return n
	}
	waitUntil(t, 60*time.Second, "y delivered", func() bool { return undelivered("y") == 0 })
	require.Equal(t, 2, undelivered("x"), "x's later events wait behind the dead one")
	for _, r := range s.broker.Records(t, s.topic, 2, 30*time.Second) {
		require.Equal(t, "y", string(r.Key), "an event of the held aggregate reached the topic")
	}

	require.NoError(t, dead.Discard(ctx, s.db.Pool, list[0].ID))
	waitUntil(t, 60*time.Second, "x delivered", func() bool { return undelivered("x") == 0 })
	var xs []string
	for _, r := range s.broker.Records(t, s.topic, 4, 30*time.Second) {
		if string(r.Key) == "x" {
			for _, h := range r.Headers {
				if h.Key == outbox.HeaderAggregateSeq {
					xs = append(xs, string(h.Value))
				}
			}
		}
	}
	require.Equal(t, []string{"2", "3"}, xs)
}
