package outboxotel

import (
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
)

// headers reads a record's headers as a propagation carrier: the first
// value of a key wins.
type headers struct{ rec *kgo.Record }

var _ propagation.TextMapCarrier = headers{}

func (h headers) Get(key string) string {
	for _, hd := range h.rec.Headers {
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
	keys := make([]string, len(h.rec.Headers))
	for i, hd := range h.rec.Headers {
		keys[i] = hd.Key
	}
	return keys
}
