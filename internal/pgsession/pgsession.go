// Package pgsession checks that a connection is a database session of its
// own, as LISTEN and session advisory locks need, and not a client of a
// transaction pooler (PgBouncer in transaction or statement mode), which
// runs each transaction on whichever server session is free.
package pgsession

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotSession is wrapped by Check's error for a connection whose
// statements do not all run in one server session.
var ErrNotSession = errors.New("connection is not a session of its own (is it a transaction pooler's client?)")

// probeTimeout bounds each step of the pooler probe. A session pooler's
// client never waits for another client; a transaction pooler's client
// waits for a free server session, which the probe holds.
const probeTimeout = 3 * time.Second

// pidQuery asks which server session runs it. It goes by the simple
// protocol (simple): a prepared statement cached on one server session would
// not exist on the next one behind a transaction pooler.
const pidQuery = "SELECT pg_backend_pid()"

const simple = pgx.QueryExecModeSimpleProtocol

// Check returns nil when conn is a session of its own on the server, an
// error wrapping ErrNotSession that says what showed otherwise, or another
// error when the check could not run (the server or pooler is down).
//
// A direct connection is recognised in one round trip: the server pid it
// was given at start-up is the one its statements run in. Behind a pooler
// the start-up pid is the pooler's own, and the probe takes one more
// connection, made with conn's config. Each round, conn runs a statement,
// which must run in the session conn ran in first, and then the other
// connection opens a transaction, which must not be handed that session.
// A transaction pooler hands out the server session freed most recently
// (PgBouncer's default, server_round_robin=0): the other connection's
// transaction gets the session conn's statement just freed, and conn's
// next statement gets the one that transaction just freed, so a round
// fails unless another client takes those sessions in between, every
// time; with server_round_robin=1, conn's statements move between
// sessions. Through a session pooler every round passes. The probe is
// repeated (probeRounds), since other clients of the pooler may get in
// between. On failure conn may be closed: the caller discards it.
func Check(ctx context.Context, conn *pgx.Conn) error {
	var first uint32
	if err := conn.QueryRow(ctx, pidQuery, simple).Scan(&first); err != nil {
		return fmt.Errorf("read the server pid: %w", err)
	}
	if first == conn.PgConn().PID() {
		return nil
	}
	octx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	other, err := pgx.ConnectConfig(octx, conn.Config())
	if err != nil {
		return fmt.Errorf("connect a second time to probe the pooler: %w", err)
	}
	defer func() { _ = other.Close(context.WithoutCancel(ctx)) }()
	for range probeRounds {
		if err := probe(ctx, conn, other, first); err != nil {
			return err
		}
	}
	return nil
}

// probeRounds is how often Check probes a pooler's client. A transaction
// pooler's client passes a round only when other clients' transactions
// take the sessions the probe frees before it takes them again; fifty
// rounds in a row do not happen (five once let a relay through a busy
// transaction pooler in CI). The order within a round matters: with the
// other connection's transaction first, one lucky round made every later
// one pass, since that transaction's session, freed last, was the one it
// was handed again. A round costs four local round trips, and only a
// pooler's client is probed at all.
const probeRounds = 50

// probe is one round of Check behind a pooler: a statement on conn, whose
// server session was first, then a transaction on other.
func probe(ctx context.Context, conn, other *pgx.Conn, first uint32) error {
	wctx, cancelWait := context.WithTimeout(ctx, probeTimeout)
	defer cancelWait()
	var again uint32
	err := conn.QueryRow(wctx, pidQuery, simple).Scan(&again)
	switch {
	case err != nil && ctx.Err() == nil && wctx.Err() != nil:
		return fmt.Errorf("%w: its statement waited %s for a server session", ErrNotSession, probeTimeout)
	case err != nil:
		return fmt.Errorf("read the server pid again: %w", err)
	case again != first:
		return fmt.Errorf("%w: its statements ran in server sessions %d and then %d", ErrNotSession, first, again)
	}
	octx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	tx, err := other.Begin(octx)
	if err != nil {
		return fmt.Errorf("begin a transaction to probe the pooler: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var taken uint32
	if err := tx.QueryRow(octx, pidQuery, simple).Scan(&taken); err != nil {
		return fmt.Errorf("read the probe's server pid: %w", err)
	}
	if taken == first {
		return fmt.Errorf("%w: another client's transaction ran in the server session (pid %d) that this connection had just used", ErrNotSession, first)
	}
	return nil
}
