package consumer_test

import (
	"os"
	"testing"

	"github.com/d419a114/outbox/internal/pgtest"
)

// TestMain runs the tests, or, in a child process started by a test
// (killChildEnv set), the child's Consumer instead.
func TestMain(m *testing.M) {
	if os.Getenv(killChildEnv) != "" {
		os.Exit(killChildMain())
	}
	pgtest.Main(m)
}
