package consumer

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
)

// TestOrderKey checks what orders a lane's records: the aggregate headers
// when the record has them (its record key is then ignored), else the
// record key, and nothing for a record with neither, which goes freely.
func TestOrderKey(t *testing.T) {
	t.Parallel()
	agg := func(typ, id string) []kgo.RecordHeader {
		return []kgo.RecordHeader{{Key: outbox.HeaderAggregateType, Value: []byte(typ)}, {Key: outbox.HeaderAggregateID, Value: []byte(id)}}
	}
	byHeader := orderKey(&kgo.Record{Key: []byte("ignored"), Headers: agg("order", "a")})
	require.Equal(t, byHeader, orderKey(&kgo.Record{Key: []byte("other"), Headers: agg("order", "a")}), "the record key ordered a record with aggregate headers")
	require.NotEqual(t, byHeader, orderKey(&kgo.Record{Headers: agg("invoice", "a")}), "two aggregate types with one id share an order key")
	require.Equal(t, orderKey(&kgo.Record{Key: []byte("a")}), orderKey(&kgo.Record{Key: []byte("a")}))
	require.NotEqual(t, orderKey(&kgo.Record{Key: []byte("a")}), orderKey(&kgo.Record{Key: []byte("b")}))
	require.Empty(t, orderKey(&kgo.Record{}), "a record with neither headers nor key is ordered")
}
