package producer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/pgsession"
)

// checkSession checks that conn, made from [RelayConfig.SessionConfig], is a
// session of its own (pgsession.Check). Through a transaction pooler the
// relay's bucket locks would be taken in one server session and its claims
// run in others, its locks would linger on a server session that other
// clients go on using, and its LISTEN would hear nothing: the error wraps
// outbox.ErrNotSession and names the fix.
func (r *Relay) checkSession(ctx context.Context, conn *pgx.Conn) error {
	err := pgsession.Check(ctx, conn)
	if errors.Is(err, outbox.ErrNotSession) {
		return r.notSession(conn.Config(), err)
	}
	if err != nil {
		return fmt.Errorf("producer: check that RelayConfig.SessionConfig gives a session of its own: %w", err)
	}
	return nil
}

// notSession is the error for a SessionConfig, cfg, that gives no session
// of its own; err wraps outbox.ErrNotSession and says what showed it.
func (r *Relay) notSession(cfg *pgx.ConnConfig, err error) error {
	return fmt.Errorf("producer: RelayConfig.SessionConfig (%s:%d) must give the relay a session of its own for its bucket locks and LISTEN; point it at the PostgreSQL server directly or at a session-mode pool (PgBouncer pool_mode=session), and keep the pool behind the transaction pooler if you like: %w",
		cfg.Host, cfg.Port, err)
}
