package consumer

import (
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
	// header is absent; "" when both are.
	AggregateID string
	// Seq is outbox.HeaderAggregateSeq, at least 1; 0 when absent, and then
	// the record bypasses ordering (see HasSeq).
	Seq int64
	// IdempotencyKey is the key the record is deduplicated on, found by
	// Config.KeyFunc's documented order; never "" for a message a handler
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
}

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

// ErrNoKey means a record carries no idempotency key: none of the
// idempotency-key, event-id and Debezium id headers, and no KeyFunc result.
// Such a record is dead-lettered rather than applied without protection
// against duplicates.
var ErrNoKey = errors.New("consumer: record has no idempotency key; set the outbox-idempotency-key, outbox-event-id or id header, or configure Config.KeyFunc")

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

// ValueTooLargeError reports a record value above Config.MaxValueBytes. It
// is permanent.
type ValueTooLargeError struct {
	Size, Max int
}

func (e *ValueTooLargeError) Error() string {
	return fmt.Sprintf("consumer: record value of %d bytes exceeds Config.MaxValueBytes (%d)", e.Size, e.Max)
}

// parse builds the Message of rec. It always returns a message (with what
// could be parsed, for the dead letter) and, for unusable input, a
// permanent error.
func parse(rec *kgo.Record, keyFunc func(*kgo.Record) (string, error), maxValue int) (*Message, error) {
	m := &Message{
		Record: rec, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
		Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Timestamp: rec.Timestamp,
	}
	var errs []error
	text := func(name string) string {
		v, ok := header(rec.Headers, name)
		if !ok {
			return ""
		}
		if !utf8.Valid(v) || strings.ContainsRune(string(v), 0) {
			errs = append(errs, &HeaderError{Header: name, Value: v, Reason: "not UTF-8 text"})
			return ""
		}
		return string(v)
	}
	m.EventID = text(outbox.HeaderEventID)
	m.EventType = text(outbox.HeaderEventType)
	m.AggregateType = text(outbox.HeaderAggregateType)
	m.AggregateID = text(outbox.HeaderAggregateID)
	m.ContentType = text(outbox.HeaderContentType)
	if m.AggregateID == "" && len(rec.Key) > 0 {
		if utf8.Valid(rec.Key) && !strings.ContainsRune(string(rec.Key), 0) {
			m.AggregateID = string(rec.Key)
		}
	}
	if v := text(outbox.HeaderAggregateSeq); v != "" {
		seq, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch {
		case err != nil:
			errs = append(errs, &HeaderError{Header: outbox.HeaderAggregateSeq, Value: []byte(v), Reason: "not a decimal integer"})
		case seq < 1:
			errs = append(errs, &HeaderError{Header: outbox.HeaderAggregateSeq, Value: []byte(v), Reason: "sequences start at 1"})
		case m.AggregateID == "":
			errs = append(errs, &HeaderError{Header: outbox.HeaderAggregateSeq, Value: []byte(v), Reason: "a sequenced record needs an aggregate id (header or record key)"})
		default:
			m.Seq = seq
		}
	} else if _, present := header(rec.Headers, outbox.HeaderAggregateSeq); present && len(errs) == 0 {
		errs = append(errs, &HeaderError{Header: outbox.HeaderAggregateSeq, Reason: "empty"})
	}
	if v := text(outbox.HeaderOccurredAt); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			errs = append(errs, &HeaderError{Header: outbox.HeaderOccurredAt, Value: []byte(v), Reason: "not an RFC 3339 time"})
		}
		m.OccurredAt = t
	}
	// The key, in the documented order.
	for _, name := range []string{outbox.HeaderIdempotencyKey, outbox.HeaderEventID, outbox.HeaderDebeziumID} {
		if v := text(name); v != "" {
			m.IdempotencyKey = v
			break
		}
	}
	if m.IdempotencyKey == "" && keyFunc != nil {
		k, err := keyFunc(rec)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("consumer: key function: %w", err))
		case !utf8.ValidString(k) || strings.ContainsRune(k, 0):
			errs = append(errs, fmt.Errorf("consumer: key function returned %q, which is not UTF-8 text", k))
		default:
			m.IdempotencyKey = k
		}
	}
	if m.IdempotencyKey == "" && len(errs) == 0 {
		errs = append(errs, ErrNoKey)
	}
	if maxValue > 0 && len(rec.Value) > maxValue {
		errs = append(errs, &ValueTooLargeError{Size: len(rec.Value), Max: maxValue})
	}
	if len(errs) > 0 {
		return m, Permanent(errors.Join(errs...))
	}
	return m, nil
}
