package integration

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/d419a114/outbox/internal/pgtest"
)

// TestMain stops the throwaway PostgreSQL cluster after the tests, if one was
// started, and fails the run if goroutines leaked.
func TestMain(m *testing.M) {
	pgtest.Main(leakChecked{m})
}

// leakChecked runs the tests and then fails the run if goroutines leaked.
type leakChecked struct{ m *testing.M }

func (l leakChecked) Run() int {
	// The snapshot is taken before the tests run: taken after, it would
	// ignore the very goroutines it is meant to find.
	before := goleak.IgnoreCurrent()
	code := l.m.Run()
	if code == 0 {
		// The shared PostgreSQL server's process waiter lives until Main
		// stops the server, after this check.
		if err := goleak.Find(before, goleak.IgnoreAnyFunction("github.com/d419a114/outbox/internal/pgtest.(*Server).launch.func1")); err != nil {
			println("goleak:", err.Error())
			return 1
		}
	}
	return code
}
