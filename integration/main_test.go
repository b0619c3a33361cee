package integration

import (
	"testing"

	"github.com/d419a114/outbox/internal/pgtest"
)

// TestMain stops the throwaway PostgreSQL cluster after the tests, if one was
// started, and fails the run if goroutines leaked.
func TestMain(m *testing.M) { pgtest.Main(m) }
