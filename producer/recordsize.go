package producer

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
)

// DefaultMaxRecordBytes is the record size limit unless WriterConfig and
// RelayConfig say otherwise: franz-go's default kgo.ProducerBatchMaxBytes,
// which is also Kafka's historical default max.message.bytes (1,000,012
// bytes).
const DefaultMaxRecordBytes = 1_000_012

// recordBatchOverhead is the size of a Kafka record batch (magic 2) with no
// records: base offset, length, leader epoch, magic, CRC, attributes, last
// offset delta, two timestamps, producer id and epoch, base sequence and
// the records' count.
const recordBatchOverhead = 8 + 4 + 4 + 1 + 4 + 2 + 4 + 8 + 8 + 8 + 2 + 4 + 4

// recordBytes is how many bytes rec takes as the only record of a record
// batch, the unit that the client's kgo.ProducerBatchMaxBytes and a
// topic's max.message.bytes bound: the batch's header, then the record's
// length, attributes, timestamp and offset deltas (0 in a batch of one),
// key, value and headers, each with its varint length. It is what
// franz-go counts before it fails a record with MESSAGE_TOO_LARGE, before
// compression; the older message-set format is counted too, for a
// broker too old for batches.
func recordBytes(rec *kgo.Record) int {
	hl := 0
	for _, h := range rec.Headers {
		hl += header(len(h.Key), len(h.Value))
	}
	return sizeOf(len(rec.Key), len(rec.Value), len(rec.Headers), hl)
}

// sizeOf is recordBytes of a record of a key and a value of these lengths
// and of headers headers, which take headerBytes.
func sizeOf(key, value, headers, headerBytes int) int {
	l := 1 + kbin.VarlongLen(0) + kbin.VarintLen(0) +
		varBytes(key) + varBytes(value) + kbin.VarintLen(clampInt32(headers)) + headerBytes
	batch := 4 + recordBatchOverhead + kbin.VarintLen(clampInt32(l)) + l
	// A message set (magic 1): offset, size, CRC, magic, attributes,
	// timestamp, key and value with int32 lengths; no headers.
	messageSet := 4 + 8 + 4 + 4 + 1 + 1 + 8 + 4 + key + 4 + value
	return max(batch, messageSet)
}

// varBytes is a length-prefixed field of n bytes.
func varBytes(n int) int { return kbin.VarintLen(clampInt32(n)) + n }

func clampInt32(n int) int32 {
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	return int32(n) //nolint:gosec // bounded above
}

// widestStamp is a Stamp whose fields take the most room on the wire
// (a 36-character event id, a 19-digit sequence, an occurred-at with
// nanoseconds): Write sizes events as if they had it, before the database
// assigns theirs.
var widestStamp = Stamp{
	EventID:    "00000000-0000-0000-0000-000000000000",
	Seq:        math.MaxInt64,
	OccurredAt: time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
}

// eventRecordBytes is recordBytes of Record("", *e, widestStamp), the most
// bytes e's record can take whatever id, sequence and time Write gives it,
// counted without building the record (Write runs it for every event). e
// has been validated: its required fields are not empty.
func eventRecordBytes(e *Event) int {
	var (
		idLen   = len(widestStamp.EventID)
		seqLen  = len(strconv.FormatInt(widestStamp.Seq, 10))
		timeLen = len(widestStamp.OccurredAt.Format(time.RFC3339Nano))
		keyLen  = len(e.IdempotencyKey)
	)
	if keyLen == 0 {
		keyLen = idLen
	}
	headers, hl := 7, header(len(outbox.HeaderEventID), idLen)+
		header(len(outbox.HeaderEventType), len(e.EventType))+
		header(len(outbox.HeaderAggregateType), len(e.AggregateType))+
		header(len(outbox.HeaderAggregateID), len(e.AggregateID))+
		header(len(outbox.HeaderAggregateSeq), seqLen)+
		header(len(outbox.HeaderIdempotencyKey), keyLen)+
		header(len(outbox.HeaderOccurredAt), timeLen)
	if e.ContentType != "" {
		headers++
		hl += header(len(outbox.HeaderContentType), len(e.ContentType))
	}
	for k, v := range e.Headers {
		headers++
		hl += header(len(k), len(v))
	}
	return sizeOf(len(e.AggregateID), len(e.Payload), headers, hl)
}

// header is the bytes a header of a key of k bytes and a value of v bytes
// takes in a record.
func header(k, v int) int { return varBytes(k) + varBytes(v) }

// clientLimit is what a relay's client lets through: the largest record
// batch it builds for a topic, and the most bytes it buffers.
type clientLimit struct {
	// batchMax is kgo.ProducerBatchMaxBytesFn (kgo.ProducerBatchMaxBytes
	// for every topic).
	batchMax func(topic string) int32
	// brokerMax is kgo.BrokerMaxWriteBytes, less the produce request's
	// own fields other than the topic's name (see forTopic).
	brokerMax int
	// buffered is kgo.MaxBufferedBytes: 0 for no limit; a record whose
	// key, value and headers exceed it fails at once.
	buffered int64
}

// limitOf reads client's limits.
func limitOf(client *kgo.Client) clientLimit {
	l := clientLimit{batchMax: func(string) int32 { return DefaultMaxRecordBytes }, brokerMax: math.MaxInt32}
	if fn, ok := client.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32); ok && fn != nil {
		l.batchMax = fn
	}
	if v, ok := client.OptValue(kgo.BrokerMaxWriteBytes).(int32); ok {
		// The request's header and produce fields (franz-go counts about
		// 27 bytes and the client id), the topic and partition arrays'
		// lengths and the partition: 128 bytes and the client id cover
		// them.
		id, _ := client.OptValue(kgo.ClientID).(string)
		l.brokerMax = int(v) - 128 - len(id)
	}
	if v, ok := client.OptValue(kgo.MaxBufferedBytes).(int64); ok {
		l.buffered = v
	}
	return l
}

// forTopic is the largest record, in recordBytes, that the client sends to
// topic.
func (l clientLimit) forTopic(topic string) int {
	return min(int(l.batchMax(topic)), l.brokerMax-max(16, len(topic)))
}

// recordTooLarge returns the error of a record the client would refuse,
// or nil when it fits. The error wraps kerr.MessageTooLarge, so it counts
// as a permanent failure.
func (l clientLimit) recordTooLarge(rec *kgo.Record) error {
	if n, limit := recordBytes(rec), l.forTopic(rec.Topic); n > limit {
		return fmt.Errorf("%w: the record is %d bytes, over the %d that the relay's client sends to topic %q (kgo.ProducerBatchMaxBytes, kgo.BrokerMaxWriteBytes); not sent, so that its aggregate's later events wait behind it: write smaller events (WriterConfig.MaxRecordBytes refuses them in Write), or raise the client's limit and the topic's max.message.bytes, then replay it",
			kerr.MessageTooLarge, n, limit, rec.Topic)
	}
	if size := userSize(rec); l.buffered > 0 && size > l.buffered {
		return fmt.Errorf("%w: the record's key, value and headers are %d bytes, over the relay client's kgo.MaxBufferedBytes (%d); not sent, so that its aggregate's later events wait behind it: raise MaxBufferedBytes, then replay it",
			kerr.MessageTooLarge, size, l.buffered)
	}
	return nil
}

// userSize is what kgo.MaxBufferedBytes counts of rec.
func userSize(rec *kgo.Record) int64 {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// checkClientLimit returns an error when the client cannot send a record
// of maxRecord bytes to topic (the relay's Topic, or "" for the
// client's default): NewRelay refuses to run below the limit that Write
// enforces.
func (l clientLimit) checkClientLimit(maxRecord int, topic string) error {
	if limit := l.forTopic(topic); limit < maxRecord {
		return fmt.Errorf("producer: the client sends records of at most %d bytes to topic %q (kgo.ProducerBatchMaxBytes, kgo.BrokerMaxWriteBytes), under RelayConfig.MaxRecordBytes (%d): an event that Write accepts could never be published. Create the client with kgo.ProducerBatchMaxBytes(%d) or more (and the topic with max.message.bytes as large), or lower MaxRecordBytes in RelayConfig and WriterConfig together",
			limit, topic, maxRecord, maxRecord)
	}
	if l.buffered > 0 && l.buffered < int64(maxRecord) {
		return fmt.Errorf("producer: the client buffers at most %d bytes (kgo.MaxBufferedBytes), under RelayConfig.MaxRecordBytes (%d): an event that Write accepts could never be published. Raise MaxBufferedBytes to at least MaxRecordBytes, or lower MaxRecordBytes in RelayConfig and WriterConfig together",
			l.buffered, maxRecord)
	}
	return nil
}
