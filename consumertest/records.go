package consumertest

import (
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/producer"
)

// Records returns events as the relay would publish them after one
// producer.Write of all of them: each gets a new event id, and each
// aggregate (aggregate type and id) its sequence numbers 1, 2, 3 in
// argument order; the record is producer.Record's, on the event's Topic
// or its aggregate type. They are on partition 0 at offsets 0, 1, 2 in
// argument order, as a produce to an empty topic of one partition puts
// them, with OccurredAt and Timestamp now. The events are not validated:
// an event that Write would refuse gives a record that the consumer
// dead-letters.
//
// Use them as [Config.Records], or feed them to a consumer.Processor. For
// an aggregate whose sample starts above sequence 1, or for records that
// break the contract on purpose, build them with producer.Record.
func Records(events ...producer.Event) []*kgo.Record {
	out := make([]*kgo.Record, len(events))
	seqs := map[[2]string]int64{}
	now := time.Now()
	for i, e := range events {
		agg := [2]string{e.AggregateType, e.AggregateID}
		seqs[agg]++
		r := producer.Record("", e, producer.Stamp{EventID: newEventID(now), Seq: seqs[agg], OccurredAt: now})
		r.Partition, r.Offset, r.Timestamp = 0, int64(i), now
		out[i] = r
	}
	return out
}

// newEventID returns a UUIDv7 (RFC 9562) for t, as Write gives events:
// t's milliseconds, then random bits.
func newEventID(t time.Time) string {
	var u [16]byte
	binary.BigEndian.PutUint64(u[:8], uint64(t.UnixMilli())<<16)
	_, _ = crand.Read(u[6:])
	u[6] = 0x70 | u[6]&0x0f
	u[8] = 0x80 | u[8]&0x3f
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
