package consumer

import (
	"context"
	"time"

	"github.com/d419a114/outbox/internal/backoff"
)

// backoff is the wait before retry number attempt (1 for the first) of a
// record, within [Config.MinBackoff] and [Config.MaxBackoff]: the Processor's
// retries and the Consumer's of a record that is not done wait alike.
func (c *Config) backoff(attempt int) time.Duration {
	return backoff.Policy{Min: c.MinBackoff, Max: c.MaxBackoff}.Delay(attempt)
}

// sleep waits d, or until ctx ends, and then returns ctx's error.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// within waits for done at most d.
func within(done <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// every runs fn every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
