package producer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRelayCountsDeliveredPerMinute: each relay adds the events it
// delivered to the minute's activity, under its own id.
func TestRelayCountsDeliveredPerMinute(t *testing.T) {
	t.Parallel()
	b := newBundle(t, 2)
	for range 30 {
		b.write(t, b.event(aggName(1)))
	}
	stop := b.startRelay(t, nil)
	defer stop()
	b.waitDelivered(t, 30*time.Second)
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(n), 0) FROM `+b.db.Table("activity")+` WHERE kind = 'delivered' AND minute >= now() - interval '5 minutes'`).Scan(&n))
	require.EqualValues(t, 30, n)
}
