package consumer_test

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/producer"
)

// TestWireRoundTrip encodes events as the relay does (producer.Record)
// and as Debezium's outbox event router does in CDC mode (docs/cdc.md),
// and reads both with the Processor's parser: every field of the event
// and its stamp comes back, the same both ways.
func TestWireRoundTrip(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		e, s := drawEvent(t), drawStamp(t)
		for path, rec := range map[string]*kgo.Record{"relay": producer.Record("", e, s), "cdc": cdcRecord(e, s)} {
			m, err := consumer.Parse(rec)
			if err != nil {
				t.Fatalf("%s: parse: %v", path, err)
			}
			wantKey := e.IdempotencyKey
			if wantKey == "" {
				wantKey = s.EventID
			}
			got := []any{m.EventID, m.EventType, m.AggregateType, m.AggregateID, m.Seq, m.IdempotencyKey, m.ContentType, string(m.Key), string(m.Value)}
			want := []any{s.EventID, e.EventType, e.AggregateType, e.AggregateID, s.Seq, wantKey, e.ContentType, e.AggregateID, string(e.Payload)}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%s: field %d is %#v, want %#v\n%v", path, i, got[i], want[i], rec.Headers)
				}
			}
			if !m.OccurredAt.Equal(s.OccurredAt) {
				t.Fatalf("%s: OccurredAt %s, want %s", path, m.OccurredAt, s.OccurredAt)
			}
			if own := ownHeaders(m.Headers); !equalMaps(own, e.Headers) {
				t.Fatalf("%s: the event's own headers are %q, want %q", path, own, e.Headers)
			}
		}
	})
}

func TestRecordHeaderOrder(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))
	rec := producer.Record("orders", producer.Event{
		AggregateType: "order", AggregateID: "o-1", EventType: "order.created", Payload: []byte("{}"),
		ContentType: "application/json", Headers: map[string]string{"b": "2", "a": "1"},
	}, producer.Stamp{EventID: "e-1", Seq: 7, OccurredAt: at})
	require.Equal(t, "orders", rec.Topic)
	require.Equal(t, "o-1", string(rec.Key))
	require.Equal(t, []kgo.RecordHeader{
		{Key: outbox.HeaderEventID, Value: []byte("e-1")},
		{Key: outbox.HeaderEventType, Value: []byte("order.created")},
		{Key: outbox.HeaderAggregateType, Value: []byte("order")},
		{Key: outbox.HeaderAggregateID, Value: []byte("o-1")},
		{Key: outbox.HeaderAggregateSeq, Value: []byte("7")},
		{Key: outbox.HeaderIdempotencyKey, Value: []byte("e-1")},
		{Key: outbox.HeaderOccurredAt, Value: []byte("2026-01-02T02:04:05.000000006Z")},
		{Key: outbox.HeaderContentType, Value: []byte("application/json")},
		{Key: "a", Value: []byte("1")},
		{Key: "b", Value: []byte("2")},
	}, rec.Headers)

	bare := producer.Record("", producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "x"}, producer.Stamp{EventID: "e-2"})
	require.Equal(t, "order", bare.Topic, "the aggregate type when neither topic nor Event.Topic is set")
	_, hasSeq := header(bare, outbox.HeaderAggregateSeq)
	_, hasAt := header(bare, outbox.HeaderOccurredAt)
	require.False(t, hasSeq || hasAt, "a zero Seq and OccurredAt leave their headers out")
	m, err := consumer.Parse(bare)
	require.NoError(t, err)
	require.False(t, m.HasSeq(), "a record without a sequence bypasses ordering")
}

func header(r *kgo.Record, name string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

// cdcRecord is e as Debezium's outbox event router publishes its row with
// the connector configuration of docs/cdc.md: the column values as
// text headers, a NULL content type as an empty header, created_at as a
// ZonedTimestamp (microseconds, UTC), the router's own id header, and
// the event's headers as one JSON object.
func cdcRecord(e producer.Event, s producer.Stamp) *kgo.Record {
	key := e.IdempotencyKey
	if key == "" {
		key = s.EventID
	}
	own := e.Headers
	if own == nil {
		own = map[string]string{}
	}
	js, err := json.Marshal(own)
	if err != nil {
		panic(err)
	}
	hs := []kgo.RecordHeader{{Key: outbox.HeaderDebeziumID, Value: []byte(s.EventID)}}
	for _, kv := range [][2]string{
		{outbox.HeaderEventID, s.EventID},
		{outbox.HeaderEventType, e.EventType},
		{outbox.HeaderAggregateType, e.AggregateType},
		{outbox.HeaderAggregateID, e.AggregateID},
		{outbox.HeaderAggregateSeq, strconv.FormatInt(s.Seq, 10)},
		{outbox.HeaderIdempotencyKey, key},
		{outbox.HeaderContentType, e.ContentType},
		{outbox.HeaderOccurredAt, s.OccurredAt.UTC().Format("2006-01-02T15:04:05.999999Z")},
		{outbox.HeaderCDCHeaders, string(js)},
	} {
		hs = append(hs, kgo.RecordHeader{Key: kv[0], Value: []byte(kv[1])})
	}
	return &kgo.Record{Topic: e.AggregateType, Key: []byte(e.AggregateID), Value: e.Payload, Headers: hs}
}

// ownHeaders are the headers of hs that are not the wire contract's.
func ownHeaders(hs []kgo.RecordHeader) map[string]string {
	out := map[string]string{}
	for _, h := range hs {
		if strings.HasPrefix(h.Key, outbox.ReservedHeaderPrefix) || h.Key == outbox.HeaderContentType || h.Key == outbox.HeaderDebeziumID {
			continue
		}
		out[h.Key] = string(h.Value)
	}
	return out
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// text draws UTF-8 text without NUL bytes of 1 to maxBytes bytes, which
// is what Write accepts: hostile runes included (controls, quotes,
// separators, combining marks, emoji, the replacement character).
func text(maxBytes int) *rapid.Generator[string] {
	r := rapid.OneOf(
		rapid.RuneFrom([]rune{' ', '"', '\'', '\\', '/', ',', ';', '=', '%', '\n', '\t', '\x1b', '\u00e9', '\u0301', '\u202e', '\ufeff', '\ufffd', '\U0001f600', '\u4e2d'}),
		rapid.Rune().Filter(func(r rune) bool { return r != 0 }),
	)
	// At the limit: a 2-byte rune repeated, and an ASCII tail if odd.
	full := strings.Repeat("\u00e9", maxBytes/2) + strings.Repeat("z", maxBytes%2)
	return rapid.OneOf(rapid.StringOfN(r, 1, -1, maxBytes), rapid.Just(full))
}

func drawEvent(t *rapid.T) producer.Event {
	e := producer.Event{
		AggregateType: text(outbox.MaxAggregateTypeBytes).Draw(t, "aggregateType"),
		AggregateID:   text(outbox.MaxAggregateIDBytes).Draw(t, "aggregateID"),
		EventType:     text(200).Draw(t, "eventType"),
		Payload:       rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(t, "payload"),
	}
	switch rapid.IntRange(0, 9).Draw(t, "payloadKind") {
	case 0:
		e.Payload = []byte{}
	case 1:
		e.Payload = bytes.Repeat([]byte{0xff, 0, 'x'}, (producer.DefaultMaxRecordBytes-16<<10)/3)
	}
	if rapid.Bool().Draw(t, "ownKey") {
		e.IdempotencyKey = text(outbox.MaxIdempotencyKeyBytes).Draw(t, "idempotencyKey")
	}
	if rapid.Bool().Draw(t, "contentType") {
		e.ContentType = text(100).Draw(t, "contentTypeValue")
	}
	// Names as Write accepts them: printable ASCII without spaces, not
	// reserved for the SDK, and not "id" in any case, which Debezium's router sets.
	name := rapid.StringOfN(rapid.RuneFrom(nil, &unicode.RangeTable{R16: []unicode.Range16{{Lo: '!', Hi: '~', Stride: 1}}}), 1, 20, -1).Filter(func(n string) bool {
		l := strings.ToLower(n)
		return !strings.HasPrefix(l, outbox.ReservedHeaderPrefix) && l != outbox.HeaderContentType && l != outbox.HeaderDebeziumID
	})
	if n := rapid.IntRange(0, 4).Draw(t, "headers"); n > 0 {
		e.Headers = map[string]string{}
		for i := range n {
			e.Headers[name.Draw(t, "name"+strconv.Itoa(i))] = rapid.StringOf(rapid.Rune().Filter(func(r rune) bool { return r != 0 && utf8.ValidRune(r) })).Draw(t, "value")
		}
	}
	return e
}

func drawStamp(t *rapid.T) producer.Stamp {
	s := producer.Stamp{
		EventID: text(40).Draw(t, "eventID"),
		Seq:     rapid.OneOf(rapid.Int64Range(1, 10), rapid.Int64Range(1, math.MaxInt64)).Draw(t, "seq"),
		// Microseconds, as PostgreSQL stores them; years 1970 to 2999.
		OccurredAt: time.UnixMicro(rapid.Int64Range(0, 32503680000*1e6).Draw(t, "occurredAt")).In(time.FixedZone("here", rapid.IntRange(-12, 14).Draw(t, "zone")*3600)),
	}
	return s
}
