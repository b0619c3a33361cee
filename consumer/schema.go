package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
)

// schemaVersionSQL reads how far Migrate brought the schema. It is the
// table Migrate itself keeps, so a schema it never ran on has none.
const schemaVersionSQL = `SELECT coalesce(max(version), 0) FROM {schema}.schema_versions`

// CheckSchema fails when the consumer's tables are missing from its
// database, or older than this version of the SDK needs, with an error
// that says to run outbox.Migrate there. Consumer.Run calls it first; a
// poll loop of one's own around Process should call it at start-up: the
// consumer's own statements would otherwise fail on every record, which
// says nothing about the records, and be retried for ever.
func (p *Processor) CheckSchema(ctx context.Context) error {
	list, err := outbox.MigrationList()
	if err != nil {
		return fmt.Errorf("consumer: read the SDK's migrations: %w", err)
	}
	want := list[len(list)-1].Version
	fix := fmt.Sprintf("run outbox.Migrate(ctx, db, &outbox.MigrateConfig{Schema: %q}) or `outbox migrate -schema %s` against the consumer's database (the one given to consumer.New or consumer.Handle)", p.cfg.Schema, p.cfg.Schema)
	var have int
	err = p.db.QueryRow(ctx, tables.Fill(schemaVersionSQL, p.cfg.Schema)).Scan(&have)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000"):
		return fmt.Errorf("consumer: schema %q has no outbox tables in this database: %s: %w", p.cfg.Schema, fix, err)
	case err != nil:
		return fmt.Errorf("consumer: read the version of schema %q: %w", p.cfg.Schema, err)
	case have < want:
		return fmt.Errorf("consumer: schema %q is at version %d and this SDK needs %d: %s", p.cfg.Schema, have, want, fix)
	}
	return nil
}

// minConns is the smallest pool a Consumer runs on: one connection for a
// record's transaction, one for the work beside it (dead letters, drains,
// the probe that tells a sick record from an outage, operator requests),
// and, when it takes operator requests, the one their listener holds.
func minConns(cfg Config) int32 {
	if cfg.RequestPoll >= 0 {
		return 3
	}
	return 2
}

// checkPool refuses a pool too small for the Consumer, which would wait
// for a connection for ever and log nothing.
func checkPool(db DB, cfg Config) error {
	pool, ok := db.(*pgxpool.Pool)
	if !ok {
		return nil
	}
	if n, least := pool.Config().MaxConns, minConns(cfg); n < least {
		return fmt.Errorf("consumer: the pool allows %d connections and a Consumer needs at least %d (add about Config.Concurrency per assigned partition): set pool_max_conns=%d or more in the connection string, or pgxpool.Config.MaxConns", n, least, least)
	}
	return nil
}
