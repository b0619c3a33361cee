package outbox

// Kafka record headers written by the relay and read by the consumer. The
// record key is the aggregate id and the value is the payload, byte for byte.
// Header values are UTF-8 text; numbers are decimal and times RFC 3339 with
// nanoseconds in UTC.
const (
	// HeaderEventID is the event's UUIDv7.
	HeaderEventID = "outbox-event-id"
	// HeaderEventType is the event type, such as "order.created".
	HeaderEventType = "outbox-event-type"
	// HeaderAggregateType is the kind of entity the event is about.
	HeaderAggregateType = "outbox-aggregate-type"
	// HeaderAggregateID is the entity's id; it is also the record key.
	HeaderAggregateID = "outbox-aggregate-id"
	// HeaderAggregateSeq is the event's position in its aggregate's sequence,
	// starting at 1 and without gaps.
	HeaderAggregateSeq = "outbox-aggregate-seq"
	// HeaderIdempotencyKey is the key consumers deduplicate on; by default
	// the event id.
	HeaderIdempotencyKey = "outbox-idempotency-key"
	// HeaderContentType is the payload's media type, when the writer gave one.
	HeaderContentType = "content-type"
	// HeaderOccurredAt is when the event was written.
	HeaderOccurredAt = "outbox-occurred-at"
	// HeaderDebeziumID is the event id header that Debezium's outbox event
	// router sets; consumers accept it as an idempotency key.
	HeaderDebeziumID = "id"
	// HeaderCDCHeaders carries, on records that Debezium's outbox event
	// router publishes in CDC mode (docs/cdc.md), the event's own headers
	// (the events table's headers column, such as traceparent) as one JSON
	// object of strings: the router cannot spread a column over several
	// headers. The relay sends each of them as a header of its own instead.
	HeaderCDCHeaders = "outbox-headers"
)

// ReservedHeaderPrefix starts every header name the SDK sets; writers may not
// use it for their own headers.
const ReservedHeaderPrefix = "outbox-"
