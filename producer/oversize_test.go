package producer_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/producer"
)

// An event too large for the relay's client (written by a writer whose
// limit is larger) is never handed to the client: it fails as permanent
// and goes dead, and its aggregate's later events, in the same batch and
// in later ones, stay off the wire until it is resolved. Other
// aggregates flow. A relay whose client cannot send MaxRecordBytes does
// not start.
func TestOversizedEventHoldsItsAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBundle(t, 2)
	const clientMax = 16 << 10
	small := kgo.ProducerBatchMaxBytes(clientMax)

	_, err := producer.NewRelay(b.db.Pool, b.broker.Client(t, small), &producer.RelayConfig{Schema: b.db.Schema})
	require.ErrorContains(t, err, "under RelayConfig.MaxRecordBytes (1000012)")
	require.ErrorContains(t, err, "kgo.ProducerBatchMaxBytes(1000012)")

	b.writer = producer.NewWriter(&producer.WriterConfig{Schema: b.db.Schema, MaxRecordBytes: 4 * clientMax})
	big := b.event("big")
	big.Payload = bytes.Repeat([]byte("x"), 2*clientMax)
	b.write(t, big, b.event("big"), b.event("other"))
	b.startRelay(t, &producer.RelayConfig{MaxRecordBytes: clientMax, MaxAttempts: 2, MinBackoff: time.Millisecond,
		MaxBackoff: 5 * time.Millisecond, PollInterval: 20 * time.Millisecond}, small)

	in, dead := inspector(t, b.db), deadEvents(t, b.db)
	var list []producer.DeadEvent
	waitFor(t, 30*time.Second, "the oversized event dead", func() bool {
		list, err = in.DeadEvents(ctx, &deadletter.ListOpts{Status: deadletter.StatusDead})
		require.NoError(t, err)
		return len(list) == 1
	})
	require.Equal(t, int64(1), list[0].Seq)
	require.True(t, list[0].Hold)
	require.Contains(t, list[0].Error, "MESSAGE_TOO_LARGE")
	require.Contains(t, list[0].Error, "WriterConfig.MaxRecordBytes")

	// A later batch: the aggregate's next event waits too, while an event
	// written after it, of another aggregate, is delivered.
	b.write(t, b.event("big"))
	b.write(t, b.event("other"))
	waitFor(t, 30*time.Second, "the other aggregate delivered", func() bool { return len(publishOrder(t, b, "other")) == 2 })
	require.Empty(t, publishOrder(t, b, "big"), "an event of the held aggregate was delivered")
	require.Equal(t, 2, b.undelivered(t))

	require.NoError(t, dead.Discard(ctx, b.db.Pool, list[0].ID))
	b.waitDelivered(t, 30*time.Second)
	require.Equal(t, []int64{2, 3}, publishOrder(t, b, "big"))
	records := b.broker.Records(t, b.topic, 4, 30*time.Second)
	seqs := map[string][]string{}
	for _, r := range records {
		seq, _ := header(r, outbox.HeaderAggregateSeq)
		seqs[string(r.Key)] = append(seqs[string(r.Key)], seq)
	}
	require.Equal(t, map[string][]string{"big": {"2", "3"}, "other": {"1", "2"}}, seqs, "the discarded event is the only one missing")
}
