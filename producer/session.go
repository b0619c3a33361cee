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

// lockSession is the session connection that holds bucket locks: a
// Relay's own, where its claims run too, or one a Fleet shares between the
// shards of one server (the locks are namespaced by schema,
// schemaLockKey), whose claims run beside it (bucketOwner.claimBeside). Its users
// take turns: acquire queues them first come, first served, so a busy
// shard that releases and asks again goes behind the shards already
// waiting. conn, gen and pid are touched only by the holder of the turn.
type lockSession struct {
	cfg *pgx.ConnConfig
	// check checks a new connection (checkSession).
	check func(context.Context, *pgx.Conn) error
	// setup runs on every new connection where claims run
	// (tables.Relay.ClaimSession); empty for a Fleet's.
	setup string
	// shared is set when several owners use the session, so that one
	// leaving releases its own locks rather than closing it.
	shared bool
	// turn holds a token while a user has the session; a buffered channel
	// hands it over in the order the users blocked (the runtime queues
	// blocked senders in order).
	turn chan struct{}
	conn *pgx.Conn
	// gen counts the connections made: an owner whose buckets were locked
	// under an older one holds none of them any more.
	gen uint64
}

func newLockSession(cfg *pgx.ConnConfig, check func(context.Context, *pgx.Conn) error, setup string, shared bool) *lockSession {
	return &lockSession{cfg: cfg, check: check, setup: setup, shared: shared, turn: make(chan struct{}, 1)}
}

// acquire waits for the session's turn. It returns ctx's error if ctx ends
// first; otherwise the caller must release.
func (s *lockSession) acquire(ctx context.Context) error {
	select {
	case s.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *lockSession) release() { <-s.turn }

// live returns the connection and its generation, or nil when there is
// none (or it died). Call it holding the turn.
func (s *lockSession) live() (*pgx.Conn, uint64) {
	if s.conn == nil || s.conn.IsClosed() {
		return nil, s.gen
	}
	return s.conn, s.gen
}

// connect makes a new connection unless a live one exists, and returns it
// with its generation. Call it holding the turn.
func (s *lockSession) connect(ctx context.Context) (*pgx.Conn, uint64, error) {
	if conn, gen := s.live(); conn != nil {
		return conn, gen, nil
	}
	s.close()
	conn, err := pgx.ConnectConfig(ctx, s.cfg)
	if err != nil {
		return nil, s.gen, err
	}
	if err := s.check(ctx, conn); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, s.gen, err
	}
	// A Relay's claims run on this session; its settings keep their cost
	// independent of the tables' statistics (tables.Relay.ClaimSession).
	// A Fleet's shards claim on their pool (tables.Relay.ClaimPooled).
	if s.setup != "" {
		if _, err := conn.Exec(ctx, s.setup); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return nil, s.gen, fmt.Errorf("producer: set up the relay's session for claims: %w", err)
		}
	}
	s.conn = conn
	s.gen++
	return conn, s.gen, nil
}

// close ends the connection, and with it every lock it held, whoever
// locked it. Call it holding the turn (or once no user is left).
func (s *lockSession) close() {
	if s.conn != nil {
		_ = s.conn.Close(context.Background())
		s.conn = nil
		s.gen++
	}
}
