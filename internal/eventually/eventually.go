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
	if !Within(within, cond) {
		t.Fatalf("condition not met within %s %v", within, msgAndArgs)
	}
}

// Within polls cond every few milliseconds until it holds (true) or the
// given time has passed (false), for goroutines that may not fail a test.
func Within(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
