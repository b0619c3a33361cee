package producer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"

	"github.com/d419a114/outbox/internal/kafkatest"
)

// Write sizes an event without building its record: the count must be the
// record's, for every event.
func TestEventRecordBytesIsTheRecords(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		e := Event{
			AggregateType:  rapid.StringN(1, 300, -1).Draw(t, "aggregateType"),
			AggregateID:    rapid.StringN(1, 300, -1).Draw(t, "aggregateID"),
			EventType:      rapid.StringN(1, 300, -1).Draw(t, "eventType"),
			ContentType:    rapid.StringN(0, 300, -1).Draw(t, "contentType"),
			IdempotencyKey: rapid.StringN(0, 300, -1).Draw(t, "key"),
			Payload:        make([]byte, rapid.IntRange(0, 1<<17).Draw(t, "payload")),
			Headers:        rapid.MapOfN(rapid.StringN(1, 40, -1), rapid.StringN(0, 300, -1), 0, 5).Draw(t, "headers"),
		}
		require.Equal(t, recordBytes(Record("", e, widestStamp)), eventRecordBytes(&e))
	})
}

// recordBytes is what franz-go counts: a client whose batch limit is a
// record's recordBytes sends it, and one whose limit is a byte less fails
// it with MESSAGE_TOO_LARGE. clientLimit reads the limit back.
func TestRecordBytesIsWhatTheClientCounts(t *testing.T) {
	t.Parallel()
	broker := kafkatest.NewFake(t)
	topic := broker.Topic(t, 1)
	ctx := context.Background()
	for _, size := range []int{1000, 5000, 70000} {
		e := Event{AggregateType: "account", AggregateID: "a-1", EventType: "e", Payload: []byte(strings.Repeat("x", size)),
			Headers: map[string]string{"traceparent": "00-abc-def-01"}}
		rec := Record(topic, e, Stamp{EventID: "0190a5c8-0000-7000-8000-000000000000", Seq: 12, OccurredAt: time.Now()})
		n := recordBytes(rec)
		for _, limit := range []int{n, n - 1} {
			cl := broker.Client(t, kgo.ProducerBatchMaxBytes(int32(limit)))
			require.Equal(t, limit, limitOf(cl).forTopic(topic))
			r := *rec
			err := cl.ProduceSync(ctx, &r).FirstErr()
			if limit == n {
				require.NoError(t, err, "a record of %d bytes under a limit of %d", n, limit)
				require.NoError(t, limitOf(cl).recordTooLarge(rec))
			} else {
				require.ErrorIs(t, err, kerr.MessageTooLarge, "a record of %d bytes under a limit of %d", n, limit)
				require.ErrorIs(t, limitOf(cl).recordTooLarge(rec), kerr.MessageTooLarge)
			}
		}
	}
}
