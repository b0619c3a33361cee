package producer_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(leakChecked{m})
}

// leakChecked runs the tests and then fails the run if goroutines leaked.
type leakChecked struct{ m *testing.M }

func (l leakChecked) Run() int {
	code := l.m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
			println("goleak:", err.Error())
			return 1
		}
	}
	return code
}
