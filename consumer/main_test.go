package consumer_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/d419a114/outbox/internal/pgtest"
)

// TestMain runs the tests, after setting rapid's number of checks
// (setModelChecks), or, in a child process started by a test
// (killChildEnv set), the child's Consumer instead.
func TestMain(m *testing.M) {
	if os.Getenv(killChildEnv) != "" {
		os.Exit(killChildMain())
	}
	flag.Parse()
	if err := setModelChecks(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	pgtest.Main(m)
}
