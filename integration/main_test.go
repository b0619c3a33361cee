package integration

import (
	"os"
	"testing"

	"github.com/d419a114/outbox/internal/pgtest"
)

// TestMain stops the throwaway PostgreSQL cluster after the tests, if one was
// started, and fails the run if goroutines leaked. Started as a relay
// process by a test (relayProcessEnv set), the binary runs a relay instead;
// as a member process (memberProcessEnv set), a consumer group member.
func TestMain(m *testing.M) {
	if os.Getenv(relayProcessEnv) != "" {
		os.Exit(relayProcessMain())
	}
	if os.Getenv(memberProcessEnv) != "" {
		os.Exit(memberProcessMain())
	}
	pgtest.Main(m)
}
