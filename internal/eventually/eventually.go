// Package eventually polls a condition with a deadline, for tests that wait
// for another goroutine or process instead of sleeping a fixed time.
package eventually

import (
	"testing"
	"time"
)

// True polls cond every few milliseconds until it holds, and fails the test
// if it does not within the given time.
func True(t testing.TB, within time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s %v", within, msgAndArgs)
		}
		<-tick.C
	}
}
