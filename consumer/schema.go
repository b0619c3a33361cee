package consumer

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
)

// CheckSchema fails when the consumer's tables are missing from its
// database, or older than this version of the SDK needs, with an error
// that wraps outbox.ErrNotMigrated and says to run outbox.Migrate there.
// [Consumer.Run] calls it first; a poll loop of one's own around Process
// should call it at start-up: the consumer's own statements would
// otherwise fail on every record, which says nothing about the records,
// and be retried for ever. A routing Processor checks every target.
func (p *Processor) CheckSchema(ctx context.Context) error {
	if p.route != nil {
		return p.route.each(func(t *Processor) error { return t.CheckSchema(ctx) })
	}
	if err := outbox.CheckMigrated(ctx, p.db, p.cfg.Schema); err != nil {
		return fmt.Errorf("consumer: %w (the consumer's database is the one given to consumer.New or consumer.Handle)", err)
	}
	return nil
}

// minConns is the smallest pool a Consumer runs on: one connection for a
// record's transaction, one for the work beside it (dead letters, drains,
// the probe that tells a sick record from an outage, operator requests).
// The requests' listener connects on its own ([Config.SessionConfig]).
const minConns = 2

// checkPool refuses a pool too small for the Consumer, which would wait
// for a connection for ever and log nothing.
func checkPool(db DB) error {
	pool, ok := db.(*pgxpool.Pool)
	if !ok {
		return nil
	}
	if n, least := pool.Config().MaxConns, int32(minConns); n < least {
		return fmt.Errorf("consumer: the pool allows %d connections and a Consumer needs at least %d (add about Config.Concurrency per assigned partition): set pool_max_conns=%d or more in the connection string, or pgxpool.Config.MaxConns", n, least, least)
	}
	return nil
}
