package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
}

// New gives the test a migrated schema of its own and a pool to reach it.
// Tests that use New can run in parallel.
func New(t testing.TB, opts *Opts) *DB {
	t.Helper()
	if opts == nil {
		opts = &Opts{}
	}
	srv, err := Shared()
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(srv.URL)
	require.NoError(t, err)
	cfg.MaxConns = 10
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)

	schema := "test_" + randomHex(6)
	_, err = outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema, PartitionEventsByDay: opts.PartitionEventsByDay, Logger: quiet})
	require.NoError(t, err)

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := pool.Exec(ctx, `DROP SCHEMA `+quote(schema)+` CASCADE`)
		pool.Close()
		if err != nil {
			t.Errorf("pgtest: drop schema %s: %v", schema, err)
		}
	})
	return &DB{Pool: pool, Schema: schema, Server: srv}
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
