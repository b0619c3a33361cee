package outbox_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/pgtest"
)

// Migrate at start-up; a second run, or a concurrent one, applies nothing.
func ExampleMigrate() {
	ctx := context.Background()
	srv, err := pgtest.Shared() // your database
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	defer pool.Exec(ctx, `DROP SCHEMA IF EXISTS example_orders CASCADE`)

	cfg := &outbox.MigrateConfig{Schema: "example_orders", Logger: slog.New(slog.DiscardHandler)}
	first, err := outbox.Migrate(ctx, pool, cfg)
	if err != nil {
		panic(err)
	}
	second, err := outbox.Migrate(ctx, pool, cfg)
	if err != nil {
		panic(err)
	}
	fmt.Println("applied:", len(first) > 0, "then:", len(second))
	// Output: applied: true then: 0
}
