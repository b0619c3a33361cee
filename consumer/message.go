package consumer

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/ordering"
)

// Message is one record as the handler sees it: the record's own fields and
// the contract fields parsed from its headers. A contract field that the
// record does not carry is in its absent state, which each field names.
type Message struct {
	// Record is the record as it arrived (for a replay or a drained record,
	// as it was stored). Handlers must not modify it.
	Record *kgo.Record

	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []kgo.RecordHeader
	Timestamp time.Time

	// EventID is outbox.HeaderEventID; "" when absent.
	EventID string
	// EventType is outbox.HeaderEventType; "" when absent.
	EventType string
	// AggregateType is outbox.HeaderAggregateType; "" when absent.
	AggregateType string
	// AggregateID is outbox.HeaderAggregateID, or the record key when the
	// header is absent; "" when both are, or when the key is not UTF-8
	// text (a record with a sequence then is dead-lettered).
	AggregateID string
	// Seq is outbox.HeaderAggregateSeq, at least 1; 0 when absent, and then
	// the record bypasses ordering (see HasSeq).
	Seq int64
	// IdempotencyKey is the key the record is deduplicated on, found by
	// [Config.KeyFunc]'s documented order; never "" for a message a handler
	// sees (a record without one is dead-lettered before the handler).
	IdempotencyKey string
	// ContentType is outbox.HeaderContentType; "" when absent.
	ContentType string
	// OccurredAt is outbox.HeaderOccurredAt; the zero time when absent.
	OccurredAt time.Time

	// Attempt counts the tries of this record in this process, from 1.
	Attempt int
	// Replayed is true when an operator replays the record from the
	// dead-letter table.
	Replayed bool

	// keyFrom names where IdempotencyKey came from: a header's name, or
	// keyFromFunc.
	keyFrom string
}

// keyFromFunc is Message.keyFrom for a key that [Config.KeyFunc] returned.
const keyFromFunc = "Config.KeyFunc"

// ErrTombstone means a record is a tombstone: a null value and no headers,
// the delete marker of a compacted topic (Debezium writes one after each
// delete unless tombstones.on.delete is false), not an event. It has no
// idempotency key, so it is dead-lettered like any record without one;
// errors.Is(err, ErrNoKey) holds too. To apply tombstones, give them a key
// with [Config.KeyFunc]: the handler then sees them with a nil Value. To
// keep them out, drop them at the source (tombstones.on.delete=false) or
// discard their dead letters.
var ErrTombstone = fmt.Errorf("consumer: record is a tombstone (null value, no headers), a compacted topic's delete marker rather than an event: %w", ErrNoKey)

// notHeldNote ends the error of a sequence header the consumer cannot
// read: with no sequence there is no position to hold the aggregate at, so
// the dead letter does not park the aggregate's later records, and
// discarding it releases nothing.
const notHeldNote = "; the aggregate is not held: its later records are applied without waiting for this one, and a Discard of this letter releases nothing"

// HasSeq reports whether the record carries an aggregate sequence, and so
// goes through ordering.
func (m *Message) HasSeq() bool { return m.Seq > 0 }

// Header returns the first value of the named header and whether the record
// has it.
func (m *Message) Header(name string) ([]byte, bool) { return header(m.Headers, name) }

func (m *Message) aggregate() ordering.Aggregate {
	return ordering.Aggregate{Type: m.AggregateType, ID: m.AggregateID}
}

func header(hs []kgo.RecordHeader, name string) ([]byte, bool) {
	for _, h := range hs {
		if h.Key == name {
			return h.Value, true
		}
	}
	return nil, false
}

// HeaderError reports a contract header the consumer cannot use. It is
// permanent: the record is dead-lettered without retries.
type HeaderError struct {
	Header string
	Value  []byte
	Reason string
}

func (e *HeaderError) Error() string {
	return fmt.Sprintf("consumer: header %s=%q: %s", e.Header, e.Value, e.Reason)
}

// ValueTooLargeError reports a record value above [Config.MaxValueBytes]. It
// is permanent.
type ValueTooLargeError struct {
	Size, Max int
}

func (e *ValueTooLargeError) Error() string {
	return fmt.Sprintf("consumer: record value of %d bytes exceeds Config.MaxValueBytes (%d)", e.Size, e.Max)
}

// parse builds the Message of rec. It always returns a message (with what
// could be parsed, for the dead letter) and, for unusable input, a
// permanent error. A field over its length limit (outbox.MaxAggregateIDBytes
// and the others) is left empty in the message, so that the dead letter
// fits the table's indexes; the record keeps it whole.
func parse(rec *kgo.Record, keyFunc func(*kgo.Record) (string, error), maxValue int) (*Message, error) {
	m := &Message{
		Record: rec, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
		Key: rec.Key, Value: rec.Value, Headers: RecordHeaders(rec), Timestamp: rec.Timestamp,
	}
	var errs []error
	bad := func(name string, v []byte, reason string) {
		errs = append(errs, &HeaderError{Header: name, Value: v, Reason: reason})
	}
	// text returns the header's value, "" when it is absent, and says
	// whether it is present.
	text := func(name string) (string, bool) {
		v, ok := header(rec.Headers, name)
		if !ok {
			return "", false
		}
		if other, twice := secondValue(rec.Headers, name, v); twice {
			bad(name, v, fmt.Sprintf("the record carries it twice, with different values (%q and %q); a record must carry one", v, other))
			return "", true
		}
		if !isText(v) {
			bad(name, v, "not UTF-8 text without NUL bytes")
			return "", true
		}
		return string(v), true
	}
	limited := func(name, v string, limit int, constant string) string {
		if len(v) > limit {
			bad(name, []byte(v[:32]), fmt.Sprintf("is %d bytes, over the limit of %d (outbox.%s); the consumer cannot index it", len(v), limit, constant))
			return ""
		}
		return v
	}
	m.EventID, _ = text(outbox.HeaderEventID)
	m.EventType, _ = text(outbox.HeaderEventType)
	m.ContentType, _ = text(outbox.HeaderContentType)
	aggType, _ := text(outbox.HeaderAggregateType)
	m.AggregateType = limited(outbox.HeaderAggregateType, aggType, outbox.MaxAggregateTypeBytes, "MaxAggregateTypeBytes")
	aggID, idHeader := text(outbox.HeaderAggregateID)
	keyNotText := false
	if !idHeader && len(rec.Key) > 0 {
		if isText(rec.Key) {
			aggID = string(rec.Key)
		} else {
			keyNotText = true
		}
	}
	m.AggregateID = limited(outbox.HeaderAggregateID, aggID, outbox.MaxAggregateIDBytes, "MaxAggregateIDBytes")
	aggOK := len(aggType) <= outbox.MaxAggregateTypeBytes && len(aggID) <= outbox.MaxAggregateIDBytes
	if v, present := text(outbox.HeaderAggregateSeq); v != "" {
		seq, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch {
		case err != nil:
			bad(outbox.HeaderAggregateSeq, []byte(v), "not a decimal integer of at most 19 digits"+notHeldNote)
		case seq < 1:
			bad(outbox.HeaderAggregateSeq, []byte(v), "sequences start at 1"+notHeldNote)
		case keyNotText:
			bad(outbox.HeaderAggregateSeq, []byte(v), "a sequenced record needs an aggregate id, and the record key is not UTF-8 text; set the "+outbox.HeaderAggregateID+" header")
		case aggID == "":
			bad(outbox.HeaderAggregateSeq, []byte(v), "a sequenced record needs an aggregate id; set the "+outbox.HeaderAggregateID+" header or the record key")
		case aggOK:
			m.Seq = seq
		}
	} else if present && len(errs) == 0 {
		bad(outbox.HeaderAggregateSeq, nil, "empty; set it to the event's sequence, from 1, or drop it to bypass ordering"+notHeldNote)
	}
	if v, _ := text(outbox.HeaderOccurredAt); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			bad(outbox.HeaderOccurredAt, []byte(v), "not an RFC 3339 time")
		}
		m.OccurredAt = t
	}
	// The key, in the documented order.
	var empty []string
	for _, name := range []string{outbox.HeaderIdempotencyKey, outbox.HeaderEventID, outbox.HeaderDebeziumID} {
		v, present := text(name)
		if v != "" {
			m.IdempotencyKey = limited(name, v, outbox.MaxIdempotencyKeyBytes, "MaxIdempotencyKeyBytes")
			m.keyFrom = name
			break
		}
		if present {
			empty = append(empty, name)
		}
	}
	if m.IdempotencyKey == "" && keyFunc != nil {
		k, err := keyFunc(rec)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("consumer: key function: %w", err))
		case k != "" && !isText([]byte(k)):
			errs = append(errs, fmt.Errorf("consumer: key function returned %q, which is not UTF-8 text without NUL bytes; fix Config.KeyFunc", k))
		case len(k) > outbox.MaxIdempotencyKeyBytes:
			errs = append(errs, fmt.Errorf("consumer: key function returned a key of %d bytes, over the limit of %d (outbox.MaxIdempotencyKeyBytes); fix Config.KeyFunc", len(k), outbox.MaxIdempotencyKeyBytes))
		default:
			m.IdempotencyKey, m.keyFrom = k, keyFromFunc
		}
	}
	if m.IdempotencyKey == "" && len(errs) == 0 {
		switch {
		case rec.Value == nil && len(rec.Headers) == 0:
			errs = append(errs, ErrTombstone)
		case len(empty) > 0:
			errs = append(errs, fmt.Errorf("consumer: record has no idempotency key: header %s is empty; set it to the event's key: %w", strings.Join(empty, " and "), ErrNoKey))
		default:
			errs = append(errs, ErrNoKey)
		}
	}
	if maxValue > 0 && len(rec.Value) > maxValue {
		errs = append(errs, &ValueTooLargeError{Size: len(rec.Value), Max: maxValue})
	}
	if len(errs) > 0 {
		return m, Permanent(errors.Join(errs...))
	}
	return m, nil
}

// isText reports whether b is UTF-8 without NUL bytes, which PostgreSQL's
// text type refuses.
func isText(b []byte) bool { return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 }

// secondValue returns a value of the named header that differs from first,
// if the record has one.
func secondValue(hs []kgo.RecordHeader, name string, first []byte) ([]byte, bool) {
	for _, h := range hs {
		if h.Key == name && !bytes.Equal(h.Value, first) {
			return h.Value, true
		}
	}
	return nil, false
}
