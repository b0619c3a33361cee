package consumer

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/internal/pgpipeline"
)

// track records tx, begun on p's database, as open until the returned function
// runs, in the set ctx carries (see withOpenSet), if any, and in the sets
// that set is part of, by the server pid of its transaction
// (pgpipeline.ServerPID), which behind a pooler is not the connection's
// start-up pid; 0 when it could not be read. The pid is kept with p, on
// whose database's server it is ended: a routing consumer's targets may be
// servers of their own.
func track(ctx context.Context, p *Processor, tx pgx.Tx) func() {
	pid := pgpipeline.ServerPID(ctx, tx)
	s, _ := ctx.Value(openKey{}).(*openSet)
	if s == nil {
		return func() {}
	}
	return s.add(session{p: p, pid: pid})
}

// session is a server session (a backend pid) of a Processor's database.
// It holds the Processor rather than its DB: a DB need not be comparable.
type session struct {
	p   *Processor
	pid uint32
}

// openSet counts the open transactions of each database session (backend
// pid), for Run to end the sessions of the ones it abandons. A set may be
// part of a larger one (parent), which counts its transactions too: a
// lane's set is part of its Consumer's.
type openSet struct {
	parent *openSet
	mu     sync.Mutex
	m      map[session]int
}

// add counts a transaction open on pid, in s and the sets it is part of,
// until the returned function runs.
func (s *openSet) add(pid session) func() {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[session]int{}
	}
	s.m[pid]++
	s.mu.Unlock()
	parentDone := func() {}
	if s.parent != nil {
		parentDone = s.parent.add(pid)
	}
	return func() {
		s.mu.Lock()
		if s.m[pid]--; s.m[pid] <= 0 {
			delete(s.m, pid)
		}
		s.mu.Unlock()
		parentDone()
	}
}

// pids returns the sessions with an open transaction.
func (s *openSet) pids() []session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.m))
}

type openKey struct{}

// withOpenSet returns ctx carrying s: the transactions begun under it are
// counted in s, so that a partition's lane can end just its own. When ctx
// carries a set already, s becomes part of it.
func withOpenSet(ctx context.Context, s *openSet) context.Context {
	if outer, _ := ctx.Value(openKey{}).(*openSet); outer != nil {
		s.parent = outer
	}
	return context.WithValue(ctx, openKey{}, s)
}

// endSessions ends the database sessions pids, which rolls back their
// transactions on the server. The pids are the server's (see track), so
// this works through a pooler too: PgBouncer then drops the client
// connection whose server session ended. A pid is still its transaction's
// while the transaction is tracked, except in the moment between its end
// and its untracking, in which a transaction pooler could give the session
// to another client. A pid of 0 (unknown) cannot be ended: that is said at
// WARN, since only the server's idle_in_transaction_session_timeout (or
// the pooler's idle_transaction_timeout) then bounds the transaction.
func endSessions(ctx context.Context, log *slog.Logger, pids []session) error {
	if len(pids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ids := map[*Processor][]int64{}
	unknown := false
	for _, s := range pids {
		if s.pid == 0 {
			unknown = true
			continue
		}
		ids[s.p] = append(ids[s.p], int64(s.pid))
	}
	if unknown {
		log.WarnContext(ctx, "consumer: cannot end the sessions of abandoned transactions whose server pid could not be read; "+
			"the server's idle_in_transaction_session_timeout (or the pooler's idle_transaction_timeout) must bound them")
	}
	var errs []error
	for p, pids := range ids {
		if _, err := p.db.Exec(ctx, `SELECT pg_terminate_backend(pid::integer) FROM unnest($1::bigint[]) AS pid`, pids); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// abandonAfter is how long the Consumer waits, once the handlers of
// records it stopped have had their contexts cancelled, for a handler that
// ignores its ctx.
const abandonAfter = time.Second
