package outboxotel

import (
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"

	"github.com/d419a114/outbox/consumer"
)

// headers reads a record's headers as a propagation carrier: the first
// value of a key wins. The headers of an event Debezium published in CDC
// mode count too (consumer.RecordHeaders), so its trace context carries
// over as the relay's does.
type headers struct{ rec *kgo.Record }

var _ propagation.TextMapCarrier = headers{}

func (h headers) Get(key string) string {
	for _, hd := range consumer.RecordHeaders(h.rec) {
		if hd.Key == key {
			return string(hd.Value)
		}
	}
	return ""
}

// Set appends a header. The carrier interface asks for it; this package
// only reads.
func (h headers) Set(key, value string) {
	h.rec.Headers = append(h.rec.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (h headers) Keys() []string {
	hs := consumer.RecordHeaders(h.rec)
	keys := make([]string, len(hs))
	for i, hd := range hs {
		keys[i] = hd.Key
	}
	return keys
}
