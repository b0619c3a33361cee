package producer_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/producer"
)

// TestFleetRetentionAndDeadEventsOnEveryShard: in a fleet, every shard's
// poison event goes dead after MaxAttempts, and every shard's delivered
// events are pruned after Retention, as a relay of its own would do.
func TestFleetRetentionAndDeadEventsOnEveryShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newFleetWorld(t, 3)
	// Larger than the client's largest batch (1 MB by default): the
	// client refuses it as MESSAGE_TOO_LARGE, on any broker.
	tooLarge := bytes.Repeat([]byte("x"), 3<<20/2)
	for _, s := range w.shards {
		writer := producer.NewWriter(&producer.WriterConfig{Schema: s.Schema, MaxRecordBytes: 2 << 20})
		require.NoError(t, pgx.BeginFunc(ctx, w.base.Pool, func(tx pgx.Tx) error {
			_, err := writer.Write(ctx, tx, producer.Event{AggregateType: "account", AggregateID: s.Name + "/sick", EventType: "e", Payload: tooLarge, Topic: w.topic})
			return err
		}))
	}
	w.write(t, w.shards, 3, 2)
	w.start(t, w.shards, &producer.FleetConfig{Relay: producer.RelayConfig{
		MaxAttempts: 2, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		Retention: time.Millisecond, RetentionInterval: 20 * time.Millisecond,
	}})
	for _, s := range w.shards {
		in, err := producer.NewInspector(w.base.Pool, s.Schema)
		require.NoError(t, err)
		eventually.True(t, 60*time.Second, func() bool {
			h, err := in.Health(ctx)
			require.NoError(t, err)
			return h.Dead == 1 && h.Undelivered == 0
		}, "shard "+s.Name+": the poison event dead, the others delivered")
		eventually.True(t, 60*time.Second, func() bool {
			var n int
			require.NoError(t, w.base.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{s.Schema, "events"}.Sanitize()).Scan(&n))
			return n == 0
		}, "shard "+s.Name+": delivered events pruned")
	}
}
