package backoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	p := Policy{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for _, tc := range []struct {
		attempt  int
		low, top time.Duration
	}{
		{0, 50 * time.Millisecond, 100 * time.Millisecond},
		{1, 50 * time.Millisecond, 100 * time.Millisecond},
		{2, 100 * time.Millisecond, 200 * time.Millisecond},
		{4, 400 * time.Millisecond, 800 * time.Millisecond},
		{10, 2500 * time.Millisecond, 5 * time.Second},
		{1000, 2500 * time.Millisecond, 5 * time.Second},
	} {
		for range 100 {
			d := p.Delay(tc.attempt)
			require.GreaterOrEqual(t, d, tc.low, "attempt %d", tc.attempt)
			require.LessOrEqual(t, d, tc.top, "attempt %d", tc.attempt)
		}
	}
}
