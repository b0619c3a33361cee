// Package backoff computes retry delays: exponential growth with full
// jitter, capped, so that many clients retrying one failure spread out.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy describes the delays. The zero value is not useful; set both fields.
type Policy struct {
	// Min is the delay before the first retry, before jitter.
	Min time.Duration
	// Max caps every delay.
	Max time.Duration
}

// Delay returns the wait before retry number attempt (1 for the first retry):
// a random duration in [d/2, d] where d = min(Max, Min * 2^(attempt-1)).
// Half the range stays fixed so that a retry never comes back at once.
func (p Policy) Delay(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := p.Max
	if shift := attempt - 1; shift < 62 {
		if grown := p.Min << shift; grown > 0 && grown < p.Max {
			d = grown
		}
	}
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + rand.N(d-half+1) //nolint:gosec // jitter spreads retries; it guards nothing
}
