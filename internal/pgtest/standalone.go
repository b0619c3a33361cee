package pgtest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
)

// NewStandalone is New for code that has no testing.TB: examples and example
// programs. It migrates a fresh schema on the shared server (or on url when
// it is not empty) and returns the database and a function that drops the
// schema and closes the pool.
func NewStandalone(ctx context.Context, url string) (*DB, func(), error) {
	var srv *Server
	if url == "" {
		var err error
		if srv, err = Shared(); err != nil {
			return nil, nil, err
		}
		url = srv.URL
	} else {
		srv = &Server{URL: url}
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, nil, fmt.Errorf("pgtest: connect: %w", err)
	}
	schema := "example_" + randomHex(6)
	if _, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema, Logger: discardLogger()}); err != nil {
		pool.Close()
		return nil, nil, err
	}
	cleanup := func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+quote(schema)+` CASCADE`)
		pool.Close()
	}
	return &DB{Pool: pool, Schema: schema, Server: srv}, cleanup, nil
}
