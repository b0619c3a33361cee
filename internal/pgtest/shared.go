package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// Shared returns the server for this process: TEST_DATABASE_URL when set
// and it has what the package's MainConfig asks for, otherwise a throwaway
// cluster started on first use from the machine's own PostgreSQL binaries
// and stopped by Main. A TEST_DATABASE_URL that lacks it (wal_level=logical
// for LogicalReplication) is passed over with a line on stderr, so that
// setting the variable never fails a package that needs more than a
// plain server.
func Shared() (*Server, error) {
	sharedOnce.Do(func() {
		if url := os.Getenv("TEST_DATABASE_URL"); url != "" {
			lack, err := lacks(url, sharedConfig)
			if err != nil {
				sharedErr = err
				return
			}
			if lack == "" {
				shared = &Server{URL: url}
				return
			}
			fmt.Fprintf(os.Stderr, "pgtest: the server in TEST_DATABASE_URL has %s; these tests start a throwaway cluster instead\n", lack)
		}
		shared, sharedErr = pgserver.StartConfig(sharedConfig)
	})
	return shared, sharedErr
}

// lacks says what of cfg the server at url does not have ("" when
// nothing).
func lacks(url string, cfg pgserver.Config) (string, error) {
	if !cfg.LogicalReplication {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", fmt.Errorf("pgtest: connect to TEST_DATABASE_URL: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var level string
	if err := conn.QueryRow(ctx, `SHOW wal_level`).Scan(&level); err != nil {
		return "", fmt.Errorf("pgtest: read wal_level of TEST_DATABASE_URL: %w", err)
	}
	if level != "logical" {
		return "wal_level=" + level + ", not logical", nil
	}
	return "", nil
}

// Own starts a throwaway cluster configured by cfg for t alone, whatever
// TEST_DATABASE_URL says, and stops it when t ends. Tests that restart or
// crash PostgreSQL put their schema on it (Opts.Server): a server given by
// URL cannot be restarted from here, and the shared one serves the
// package's other tests.
func Own(t testing.TB, cfg pgserver.Config) *Server {
	t.Helper()
	srv, err := pgserver.StartConfig(cfg)
	if err != nil {
		t.Fatalf("pgtest: this test restarts PostgreSQL, so it starts a cluster of its own from the machine's binaries whatever TEST_DATABASE_URL says: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	return srv
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
