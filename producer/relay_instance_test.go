package producer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/producer"
)

func TestInspectorRelays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBundle(t, 1)
	in := inspector(t, b.db)

	list, err := in.Relays(ctx)
	require.NoError(t, err)
	require.Empty(t, list)

	// Two relays share the 64 buckets; each list shows which it holds.
	const every = 50 * time.Millisecond
	stopA := b.startRelay(t, &producer.RelayConfig{RelayID: "a", RebalanceInterval: every})
	b.startRelay(t, &producer.RelayConfig{RelayID: "b", RebalanceInterval: every})
	eventually.True(t, 20*time.Second, func() bool {
		list, err = in.Relays(ctx)
		require.NoError(t, err)
		return len(list) == 2 && len(list[0].Buckets) == 32 && len(list[1].Buckets) == 32
	}, "two relays with 32 buckets each")
	require.Equal(t, "a", list[0].RelayID)
	require.Equal(t, "b", list[1].RelayID)
	seen := map[int32]bool{}
	for _, in := range list {
		require.True(t, in.Live)
		require.WithinDuration(t, time.Now(), in.HeartbeatAt, time.Minute)
		for _, bk := range in.Buckets {
			require.False(t, seen[bk], "bucket %d held twice", bk)
			require.True(t, bk >= 0 && bk < 64)
			seen[bk] = true
		}
	}

	// The relay that stops gives its buckets up; the other takes them all.
	stopA()
	eventually.True(t, 20*time.Second, func() bool {
		list, err = in.Relays(ctx)
		require.NoError(t, err)
		return len(list) == 1 && list[0].RelayID == "b" && len(list[0].Buckets) == 64
	}, "relay b holds every bucket")
}
