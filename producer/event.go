package producer

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/d419a114/outbox"
)

// Event is one event to write. AggregateType, AggregateID and EventType are
// required; the rest is optional (a nil Payload is published as an empty
// value).
type Event struct {
	// AggregateType is the kind of entity the event is about, such as
	// "order": at most outbox.MaxAggregateTypeBytes bytes.
	AggregateType string
	// AggregateID identifies the entity: at most outbox.MaxAggregateIDBytes
	// bytes. It becomes the Kafka record key, so one aggregate's events stay
	// on one partition, in order.
	AggregateID string
	// EventType names what happened, such as "order.created".
	EventType string
	// Payload is published byte for byte as the record value.
	Payload []byte
	// Topic is where the event goes. Default: the relay's Topic, or the
	// aggregate type when that is empty too.
	Topic string
	// ContentType is the payload's media type, published as the content-type
	// header when set.
	ContentType string
	// Headers are published with the event, after the SDK's own. Names must
	// be printable ASCII without spaces, may not start with
	// outbox.ReservedHeaderPrefix and may not be "id" (CDC's event id
	// header); values must be UTF-8 without NUL bytes.
	Headers map[string]string
	// IdempotencyKey is what consumers deduplicate on: at most
	// outbox.MaxIdempotencyKeyBytes bytes. Default: the event id. Set it to
	// the key of the request that caused the event to make a retried
	// request produce a duplicate that consumers drop.
	IdempotencyKey string
}

// Written describes an event that Write inserted.
type Written struct {
	// ID is the database id, which orders claims.
	ID int64
	// EventID is the event's UUIDv7 in canonical text form.
	EventID string
	// Seq is the event's position in its aggregate's sequence, from 1.
	Seq int64
}

func (e *Event) validate(i int, maxRecord int) error {
	bad := func(field, reason string) error { return &ValidationError{Index: i, Field: field, Reason: reason} }
	switch {
	case e.AggregateType == "":
		return bad("AggregateType", "is empty")
	case e.AggregateID == "":
		return bad("AggregateID", "is empty")
	case e.EventType == "":
		return bad("EventType", "is empty")
	}
	// The fields that end up in an index, here (sequences) or in the
	// consumer's tables: an event over a limit is one no consumer of this
	// SDK could ever apply.
	for _, f := range []struct {
		name, v, constant string
		limit             int
	}{
		{"AggregateType", e.AggregateType, "MaxAggregateTypeBytes", outbox.MaxAggregateTypeBytes},
		{"AggregateID", e.AggregateID, "MaxAggregateIDBytes", outbox.MaxAggregateIDBytes},
		{"IdempotencyKey", e.IdempotencyKey, "MaxIdempotencyKeyBytes", outbox.MaxIdempotencyKeyBytes},
	} {
		if len(f.v) > f.limit {
			return bad(f.name, fmt.Sprintf("is %d bytes; the limit is outbox.%s (%d)", len(f.v), f.constant, f.limit))
		}
	}
	for _, f := range []struct{ name, v string }{
		{"AggregateType", e.AggregateType}, {"AggregateID", e.AggregateID}, {"EventType", e.EventType},
		{"Topic", e.Topic}, {"ContentType", e.ContentType}, {"IdempotencyKey", e.IdempotencyKey},
	} {
		if !utf8.ValidString(f.v) || strings.ContainsRune(f.v, 0) {
			return bad(f.name, "is not UTF-8 text without NUL bytes")
		}
	}
	for name, value := range e.Headers {
		if !validHeaderName(name) {
			return bad("Headers", fmt.Sprintf("name %q is not printable ASCII without spaces", name))
		}
		if strings.HasPrefix(strings.ToLower(name), outbox.ReservedHeaderPrefix) || strings.EqualFold(name, outbox.HeaderContentType) {
			return bad("Headers", fmt.Sprintf("name %q is reserved for the SDK (set ContentType for content-type)", name))
		}
		if strings.EqualFold(name, outbox.HeaderDebeziumID) {
			return bad("Headers", fmt.Sprintf("name %q is the event id header of change data capture (Debezium's outbox router writes it), which would hide this one; choose another name", name))
		}
		if !utf8.ValidString(value) || strings.ContainsRune(value, 0) {
			return bad("Headers", fmt.Sprintf("value of %q is not UTF-8 text without NUL bytes", name))
		}
	}
	if n := eventRecordBytes(e); n > maxRecord {
		return bad("Payload", fmt.Sprintf("makes a Kafka record of up to %d bytes (payload %d, headers and key the rest), over the limit of %d (WriterConfig.MaxRecordBytes; the relay's client could not send it): store the content elsewhere and send a reference, or raise the limit in WriterConfig, RelayConfig and the client (kgo.ProducerBatchMaxBytes) together",
			n, len(e.Payload), maxRecord))
	}
	return nil
}

func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}
