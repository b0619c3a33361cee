package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
)

// DB is one test's database: a fresh schema, migrated, on the shared server.
type DB struct {
	// Pool connects to the server; it is closed when the test ends.
	Pool *pgxpool.Pool
	// Schema is the test's own schema, dropped when the test ends.
	Schema string
	// Server is the server the schema lives on.
	Server *Server
}

// Opts tunes New.
type Opts struct {
	// PartitionEventsByDay migrates the events table as day partitions.
	PartitionEventsByDay bool
	// MaxConns bounds the pool. Default 10.
	MaxConns int32
	// Server is the server to put the schema on. Default Shared(); a test
	// that restarts the server passes one of its own (Own).
	Server *Server
}

// New gives the test a migrated schema of its own and a pool to reach it,
// both gone when the test ends. Tests that use New can run in parallel.
func New(t testing.TB, opts *Opts) *DB {
	t.Helper()
	db, closeDB, err := Open(opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := closeDB(); err != nil {
			t.Error(err)
		}
	})
	return db
}

// Open is New for code without a testing.TB, such as runnable examples:
// the caller runs the returned function to drop the schema and close the
// pool.
func Open(opts *Opts) (*DB, func() error, error) {
	if opts == nil {
		opts = &Opts{}
	}
	srv := opts.Server
	if srv == nil {
		var err error
		if srv, err = Shared(); err != nil {
			return nil, nil, err
		}
	}
	cfg, err := pgxpool.ParseConfig(srv.URL)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = 10
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	schema := "test_" + randomHex(6)
	_, err = outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema, PartitionEventsByDay: opts.PartitionEventsByDay, Logger: quiet})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	closeDB := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := pool.Exec(ctx, `DROP SCHEMA `+quote(schema)+` CASCADE`)
		pool.Close()
		if err != nil {
			return fmt.Errorf("pgtest: drop schema %s: %w", schema, err)
		}
		return nil
	}
	return &DB{Pool: pool, Schema: schema, Server: srv}, closeDB, nil
}

// Table returns the quoted, schema-qualified name of one of the SDK's tables.
func (db *DB) Table(name string) string { return quote(db.Schema) + "." + quote(name) }

func quote(ident string) string { return pgx.Identifier{ident}.Sanitize() }

// quiet drops Migrate's log lines, which say the same for every test.
var quiet = slog.New(slog.DiscardHandler)

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
