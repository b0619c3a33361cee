package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/pgsession"
)

// sessionConfig is the operator request listener's connection config:
// [Config.SessionConfig] (a routing consumer's target's
// [Target.SessionConfig]), else the pool's when db is a *pgxpool.Pool, else
// nil: no listener, polling alone.
func (p *Processor) sessionConfig() *pgx.ConnConfig {
	if p.cfg.SessionConfig != nil {
		return p.cfg.SessionConfig
	}
	if pool, ok := p.db.(*pgxpool.Pool); ok {
		return pool.Config().ConnConfig
	}
	return nil
}

// requestSession connects the operator request listener with cfg, a
// connection of its own outside the pool, and checks that it is a session
// of its own (pgsession.Check): through a transaction pooler LISTEN hears
// nothing. When it is not, it says so at WARN and waits for ctx to end, so
// that the listener gives up for good and requests are found by polling
// alone.
func (p *Processor) requestSession(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	err = pgsession.Check(ctx, conn)
	if err == nil {
		return conn, nil
	}
	_ = conn.Close(context.WithoutCancel(ctx))
	if !errors.Is(err, outbox.ErrNotSession) {
		return nil, fmt.Errorf("check that the listener's connection is a session of its own: %w", err)
	}
	p.log.WarnContext(ctx, "consumer: not listening for operator requests: Config.SessionConfig (default: the pool's config) must give the listener a session of its own; "+
		"point it at the PostgreSQL server directly or at a session-mode pool (PgBouncer pool_mode=session). Requests are taken up at each RequestPoll meanwhile",
		slog.String("host", cfg.Host), slog.Int("port", int(cfg.Port)), slog.Duration("request_poll", p.cfg.RequestPoll), slog.String("error", err.Error()))
	<-ctx.Done()
	return nil, ctx.Err()
}
