package consumer

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
)

// RecordHeaders returns rec's headers with, for a record Debezium's outbox
// event router published in CDC mode, the event's own headers spread out:
// the router carries them as one JSON object in outbox.HeaderCDCHeaders,
// and each becomes a header of its own, after the record's, unless the
// record already carries that name. So [Message.Headers], and a tracer that
// reads the trace context from them, see the same headers whether the
// relay or Debezium published the event. A header that is not a JSON
// object of strings is left as it is.
func RecordHeaders(rec *kgo.Record) []kgo.RecordHeader {
	v, ok := header(rec.Headers, outbox.HeaderCDCHeaders)
	if !ok {
		return rec.Headers
	}
	var own map[string]string
	if err := json.Unmarshal(v, &own); err != nil || len(own) == 0 {
		return rec.Headers
	}
	out := make([]kgo.RecordHeader, len(rec.Headers), len(rec.Headers)+len(own))
	copy(out, rec.Headers)
	for _, name := range slices.Sorted(maps.Keys(own)) {
		if _, taken := header(rec.Headers, name); !taken {
			out = append(out, kgo.RecordHeader{Key: name, Value: []byte(own[name])})
		}
	}
	return out
}
