package pgtest

import (
	"fmt"
	"os"
	"sync"

	"go.uber.org/goleak"

	"github.com/d419a114/outbox/internal/pgserver"
)

// Server is the PostgreSQL server the tests of one process share.
type Server = pgserver.Server

var (
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
	// sharedConfig is the throwaway cluster's configuration; MainConfig
	// sets it before any test runs.
	sharedConfig pgserver.Config
)

// Shared returns the server for this process: TEST_DATABASE_URL when set,
// otherwise a throwaway cluster started on first use from the machine's own
// PostgreSQL binaries and stopped by Main.
func Shared() (*Server, error) {
	sharedOnce.Do(func() {
		if url := os.Getenv("TEST_DATABASE_URL"); url != "" {
			shared = &Server{URL: url}
			return
		}
		shared, sharedErr = pgserver.StartConfig(sharedConfig)
	})
	return shared, sharedErr
}

// Main runs the package's tests, stops the throwaway cluster if one was
// started, and then fails the run if the tests left goroutines behind.
// Call it from TestMain.
func Main(m interface{ Run() int }) { MainConfig(m, pgserver.Config{}) }

// MainConfig is Main for a package whose throwaway cluster needs cfg, such
// as wal_level=logical for change data capture. A server given by
// TEST_DATABASE_URL is used as it is; check what the tests need of it.
func MainConfig(m interface{ Run() int }, cfg pgserver.Config) {
	sharedConfig = cfg
	before := goleak.IgnoreCurrent()
	code := m.Run()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(before); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}
