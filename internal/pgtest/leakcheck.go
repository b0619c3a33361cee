package pgtest

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// MainLeakChecked is Main with goleak: after the tests pass it fails the
// run if goroutines other than the harness's own are still running.
func MainLeakChecked(m *testing.M, opts ...goleak.Option) {
	Main(leakChecked{m: m, opts: opts})
}

type leakChecked struct {
	m    *testing.M
	opts []goleak.Option
}

func (l leakChecked) Run() int {
	code := l.m.Run()
	if code != 0 {
		return code
	}
	opts := append([]goleak.Option{
		// The shared server's process reaper runs until Main stops it.
		goleak.IgnoreAnyFunction("github.com/d419a114/outbox/internal/pgtest.(*Server).launch.func1"),
	}, l.opts...)
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}
