package consumer_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
)

func TestRecordHeaders(t *testing.T) {
	t.Parallel()
	hs := func(kv ...string) []kgo.RecordHeader {
		var out []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			out = append(out, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return out
	}
	tests := []struct {
		name string
		in   []kgo.RecordHeader
		want []kgo.RecordHeader
	}{
		{"NoCDCHeader", hs("a", "1"), hs("a", "1")},
		{"Spread", hs(outbox.HeaderEventID, "e", outbox.HeaderCDCHeaders, `{"z":"2","traceparent":"tp"}`),
			hs(outbox.HeaderEventID, "e", outbox.HeaderCDCHeaders, `{"z":"2","traceparent":"tp"}`, "traceparent", "tp", "z", "2")},
		{"TheRecordsOwnHeaderWins", hs(outbox.HeaderEventID, "e", outbox.HeaderCDCHeaders, `{"outbox-event-id":"forged"}`),
			hs(outbox.HeaderEventID, "e", outbox.HeaderCDCHeaders, `{"outbox-event-id":"forged"}`)},
		{"NotAnObjectOfStrings", hs(outbox.HeaderCDCHeaders, `{"n":1}`), hs(outbox.HeaderCDCHeaders, `{"n":1}`)},
		{"NotJSON", hs(outbox.HeaderCDCHeaders, `nope`), hs(outbox.HeaderCDCHeaders, `nope`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := &kgo.Record{Headers: tt.in}
			require.Equal(t, tt.want, consumer.RecordHeaders(rec))
			require.Equal(t, tt.in, rec.Headers, "the record is left as it is")
		})
	}
}
