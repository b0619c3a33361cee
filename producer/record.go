package producer

import (
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
)

// Stamp is what Write adds to an Event: the identity and position that
// travel with it on the wire.
type Stamp struct {
	// EventID is the event's id ([Written.EventID]), a UUIDv7 for events
	// that Write stored.
	EventID string
	// Seq is the event's position in its aggregate's sequence
	// ([Written.Seq]), from 1.
	Seq int64
	// OccurredAt is when the event was written (the events table's
	// created_at).
	OccurredAt time.Time
}

// Record returns e as the relay publishes it, stamped with s. This is the
// wire contract; consumers of any language can rely on it:
//
//   - Topic: topic; when topic is "", e.Topic, else e.AggregateType (the
//     relay passes its choice: e.Topic, else RelayConfig.Topic, else the
//     aggregate type).
//   - Key: e.AggregateID, so one aggregate's records share a partition.
//   - Value: e.Payload, byte for byte (nil stays nil; the relay sends a
//     stored event's payload, which is never nil).
//   - Headers, in this order, each value UTF-8 text:
//     outbox.HeaderEventID (s.EventID), outbox.HeaderEventType,
//     outbox.HeaderAggregateType, outbox.HeaderAggregateID,
//     outbox.HeaderAggregateSeq (s.Seq in decimal),
//     outbox.HeaderIdempotencyKey (e.IdempotencyKey, or s.EventID when it
//     is empty), outbox.HeaderOccurredAt (s.OccurredAt in UTC, RFC 3339
//     with nanoseconds), outbox.HeaderContentType (e.ContentType), then
//     e.Headers sorted by name, as they are. Each of the SDK's headers is
//     left out when its value would be empty (a Seq of 0, a zero
//     OccurredAt): the consumer reads an absent header as the empty value,
//     and a record without a sequence bypasses ordering. An event that
//     Write stored has all of them but, maybe, the content type.
//
// Partition, Offset and Timestamp are left for the producer to set.
// Record does not validate e: Write does, before an event is stored.
func Record(topic string, e Event, s Stamp) *kgo.Record {
	if topic == "" {
		topic = e.Topic
	}
	if topic == "" {
		topic = e.AggregateType
	}
	key := e.IdempotencyKey
	if key == "" {
		key = s.EventID
	}
	headers := make([]kgo.RecordHeader, 0, 8+len(e.Headers))
	add := func(k, v string) {
		if v != "" {
			headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	add(outbox.HeaderEventID, s.EventID)
	add(outbox.HeaderEventType, e.EventType)
	add(outbox.HeaderAggregateType, e.AggregateType)
	add(outbox.HeaderAggregateID, e.AggregateID)
	if s.Seq != 0 {
		add(outbox.HeaderAggregateSeq, strconv.FormatInt(s.Seq, 10))
	}
	add(outbox.HeaderIdempotencyKey, key)
	if !s.OccurredAt.IsZero() {
		add(outbox.HeaderOccurredAt, s.OccurredAt.UTC().Format(time.RFC3339Nano))
	}
	add(outbox.HeaderContentType, e.ContentType)
	for _, k := range sortedKeys(e.Headers) {
		headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(e.Headers[k])})
	}
	return &kgo.Record{Topic: topic, Key: []byte(e.AggregateID), Value: e.Payload, Headers: headers}
}

// sortedKeys returns m's keys in order, without sorting one or none.
func sortedKeys(m map[string]string) []string {
	if len(m) < 2 {
		keys := make([]string, 0, 1)
		for k := range m {
			keys = append(keys, k)
		}
		return keys
	}
	return slices.Sorted(maps.Keys(m))
}
