package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/dedupe"
	"github.com/d419a114/outbox/internal/backoff"
	"github.com/d419a114/outbox/internal/pgpipeline"
	"github.com/d419a114/outbox/internal/tables"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

// Handler applies one message's effect inside tx. It must do all its
// database work in tx: the claim of the message's key, the move of its
// aggregate's position and the effect commit or roll back together.
// Returning an error rolls tx back; the message is retried, or
// dead-lettered at once when the error is Permanent. Work outside the
// database (an email, an HTTP call) is not undone by a rollback and may
// happen more than once. A Handler that also implements BatchHandler
// applies batch mode's batches in one call.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, m *Message) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, m *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, m *Message) error { return f(ctx, tx, m) }

// DB is the database handle a Processor needs: outbox.DB's methods, and
// connections of its own (Acquire), on which it sends BEGIN in one round
// trip with a record's first statement. *pgxpool.Pool satisfies it; a
// wrapper of a pool must offer all of it. Use the primary: dedupe,
// positions and dead letters must never be read from a replica.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Processor applies records through a handler with dedupe, ordering and
// dead-lettering in the handler's transaction. It is safe for concurrent
// use, but records of one partition must be given to it one after another,
// in offset order, for ordering's parking to mean anything.
type Processor struct {
	db       DB
	h        Handler
	bh       BatchHandler // h when it is one, else nil
	cfg      Config
	name     string
	dedupe   *dedupe.Store
	ordering *ordering.Tracker
	dead     *deadletter.Store
	ops      *operator.Store
	log      *slog.Logger
	// ready wakes Consumer.Run's drainer; see readyToDrain and leftInLine.
	ready chan struct{}
	// sql holds the hot path's statements; see tables.HotPath.
	sql tables.HotPath
	// tracer is Config.Tracer; batchTracer the same when it is a
	// BatchTracer.
	tracer      Tracer
	batchTracer BatchTracer
	// fallbackKeys rate-limits noteDuplicate's warning.
	fallbackKeys fallbackKeyWarner
	// applied counts the records applied through Process and
	// ProcessBatch, drained ones included.
	applied atomic.Int64
	// requests tunes ServeRequests; the zero value is production's.
	requests requestTuning
}

// Handle returns a Processor that applies records for the consumer name
// through h, each in a transaction begun on db. Use it inside a poll loop
// you already have: call Process (or ProcessBatch) for each record, and
// mark its offset for commit only when it returns no error. name scopes the
// processed keys, positions and dead letters: give each consuming service
// its own. When h is also a BatchHandler, ProcessBatch applies a batch
// through one HandleBatch call on its happy path.
func Handle(db DB, name string, h Handler, cfg *Config) (*Processor, error) {
	if db == nil || h == nil {
		return nil, errors.New("consumer: Handle needs a database and a handler")
	}
	if len(name) > outbox.MaxConsumerNameBytes {
		return nil, fmt.Errorf("consumer: name is %d bytes, over the limit of %d (outbox.MaxConsumerNameBytes)", len(name), outbox.MaxConsumerNameBytes)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d, err := dedupe.New(name, &dedupe.Config{Schema: c.Schema, Retention: c.KeyRetention})
	if err != nil {
		return nil, err
	}
	o, err := ordering.New(name, &ordering.Config{Schema: c.Schema, GapPolicy: c.GapPolicy, FirstSeen: c.FirstSeen})
	if err != nil {
		return nil, err
	}
	bh, _ := h.(BatchHandler)
	bt, _ := c.Tracer.(BatchTracer)
	return &Processor{
		tracer: c.Tracer, batchTracer: bt,
		db: db, h: h, bh: bh, cfg: c, name: name, dedupe: d, ordering: o, ready: make(chan struct{}, 1),
		dead: deadletter.New(&deadletter.Config{Schema: c.Schema}),
		ops:  operator.New(&operator.Config{Schema: c.Schema}),
		log:  c.Logger.With(slog.String("consumer", name)),
		// The claim and the move in one statement, sent in one round trip
		// with BEGIN (see pgpipeline.Begin): at one record per transaction a
		// round trip costs about as much as the record's own work.
		sql: tables.For(c.Schema).HotPath,
	}, nil
}

// Name returns the consumer name.
func (p *Processor) Name() string { return p.name }

// appliedCount returns how many records Process and ProcessBatch applied,
// drained ones included: the Consumer's heartbeat reports it.
func (p *Processor) appliedCount() int64 { return p.applied.Load() }

// Process applies rec in its own transaction and returns what happened. A
// nil error means the record is done with (applied, duplicate, parked or
// dead-lettered) and its offset may be committed. A non-nil error means it
// is not: the database failed, ctx ended, or under ordering.GapFail the
// record waits for a gap (*ordering.GapError); process it again later.
//
// Handler errors are retried with backoff up to Config.MaxAttempts (once
// for a Permanent error); then the record is written to the dead-letter
// table in a transaction of its own, and its aggregate's later records are
// parked behind it.
func (p *Processor) Process(ctx context.Context, rec *kgo.Record) (Result, error) {
	return p.traced(ctx, rec, p.processRecord)
}

func (p *Processor) processRecord(ctx context.Context, rec *kgo.Record) (Result, error) {
	m, err := parse(rec, p.cfg.KeyFunc, p.cfg.MaxValueBytes)
	if err != nil {
		return p.newRun(m).deadLetter(ctx, err)
	}
	return p.newRun(m).process(ctx, nil)
}

// deadLetterRecord writes rec to the dead-letter table for cause, without
// running its handler: the share group runner's seam for a record it
// cannot finish on its last delivery.
func (p *Processor) deadLetterRecord(ctx context.Context, rec *kgo.Record, cause error) (Result, error) {
	m, _ := parse(rec, p.cfg.KeyFunc, p.cfg.MaxValueBytes)
	return p.newRun(m).deadLetter(ctx, cause)
}

// recordRun is one record's way through the state machine, from Process
// (or a batch gone one record at a time) to its handler: the message, the
// counts of its tries, and the transaction of the try in progress. Each
// step is a method of it instead of a function passing the same values
// along. Only the goroutine applying the record touches it.
type recordRun struct {
	p *Processor
	m *Message
	// handlerRuns counts the handler's runs. attempt counts the tries that
	// failed for the record's sake, toward MaxAttempts; transient counts
	// those that failed for the database's, which never dead-letter: after
	// MaxAttempts of them in a row the record is handed back undone.
	handlerRuns, attempt, transient int
	// tx is the transaction of the try in progress; pre is what its first
	// statement, sent with BEGIN, said, or nil when apply is to claim the
	// key in tx.
	tx  pgx.Tx
	pre *claimed
}

// newRun starts m's way through the state machine.
func (p *Processor) newRun(m *Message) *recordRun { return &recordRun{p: p, m: m} }

// processAfter is process for a record whose handler already ran once and
// failed with prior (in a batch that was rolled back), so that batch mode
// tries each record as often as single mode does.
func (p *Processor) processAfter(ctx context.Context, m *Message, prior error) (Result, error) {
	return p.newRun(m).process(ctx, prior)
}

// process applies the record, with retries, and dead-letters it when they
// run out; see Process. prior, when not nil, is the error of the handler's
// run in a batch that was rolled back (see processAfter).
func (r *recordRun) process(ctx context.Context, prior error) (Result, error) {
	p, m, err := r.p, r.m, prior
	if prior != nil {
		r.handlerRuns, r.attempt = 1, 1
	}
	class := classRecord
	for {
		if err != nil {
			if ctx.Err() != nil {
				return Result{}, notDone(ctx, m, "handler did not finish")
			}
			var gap *ordering.GapError
			if errors.As(err, &gap) {
				return Result{}, err
			}
			tries := r.attempt
			class = p.judge(ctx, classify(err), err, m)
			switch class {
			case classTransient:
				if r.transient++; r.transient >= p.cfg.MaxAttempts {
					return Result{}, err
				}
				tries = r.transient
			case classData:
				return r.deadLetter(ctx, err)
			default:
				if r.attempt >= p.cfg.MaxAttempts || IsPermanent(err) {
					return r.deadLetter(ctx, err)
				}
				r.transient = 0
			}
			p.log.WarnContext(ctx, "consumer: record failed, will retry",
				slog.String("topic", m.Topic), slog.Int("partition", int(m.Partition)), slog.Int64("offset", m.Offset),
				slog.Int("attempt", r.attempt), slog.Bool("transient", tries == r.transient), slog.String("error", err.Error()))
			if sleep(ctx, p.cfg.backoff(tries)) != nil {
				return Result{}, notDone(ctx, m, "not retried")
			}
		}
		if class != classTransient {
			r.attempt++
		}
		m.Attempt = r.attempt + r.transient
		var res Result
		res, err = r.try(ctx)
		if err == nil {
			res.Attempts = r.handlerRuns
			if res.Drained == drainChunk {
				n, err := p.drainRest(ctx, m.aggregate())
				res.Drained += n
				if err != nil {
					p.log.WarnContext(ctx, "consumer: record applied, but draining the rest of its aggregate's parked records failed; DrainReady, which Run calls, applies them later",
						slog.String("aggregate", m.aggregate().String()), slog.String("error", err.Error()))
				}
			}
			return res, nil
		}
	}
}

// notDone is the error for a record that ctx ended before it was done,
// saying which record and whether a deadline or a cancel ended it.
func notDone(ctx context.Context, m *Message, what string) error {
	when := "before the context was cancelled"
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		when = "before the context's deadline"
	}
	return fmt.Errorf("consumer: record %s/%d@%d: %s %s: %w", m.Topic, m.Partition, m.Offset, what, when, ctx.Err())
}

// try runs one transaction for the record: BEGIN with the claim, apply,
// commit.
func (r *recordRun) try(ctx context.Context) (Result, error) {
	// BEGIN travels with the claim: one round trip fewer per record.
	sql, args := r.firstStatement()
	var pre claimed
	tx, release, err := pgpipeline.Begin(ctx, r.p.db, sql, args, &pre.fresh, &pre.parked)
	if err != nil {
		return Result{}, infra(fmt.Errorf("consumer: begin and claim key: %w", err))
	}
	defer release()
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	defer track(ctx, tx)()
	r.tx, r.pre = tx, &pre
	defer func() { r.tx, r.pre = nil, nil }()
	res, err := r.apply(ctx)
	if err != nil {
		return Result{}, connectionLost(tx, err)
	}
	if err := tx.Commit(ctx); err != nil {
		// A commit can fail because of the handler's deferred constraints
		// or because the connection broke; either way the record is tried
		// again and dedupe sorts out a commit that did land.
		return Result{}, connectionLost(tx, fmt.Errorf("consumer: commit: %w", err))
	}
	return res, nil
}

// connectionLost turns an error that came with the loss of tx's connection
// (the server restarted, the network failed) into an infrastructure error:
// it says nothing about the record, which must not be dead-lettered for it.
// A handler that timed out lost its connection because of its own deadline
// (pgx closes a connection whose query is cancelled): that stays the
// record's.
func connectionLost(tx pgx.Tx, err error) error {
	var te *HandlerTimeoutError
	if isInfra(err) || errors.As(err, &te) {
		return err
	}
	if tx.Conn().IsClosed() {
		return infra(err)
	}
	return err
}

// claimed is the outcome of the hot path's first statement: whether the key
// was fresh and, when the position moved, the aggregate's parked count.
type claimed struct {
	fresh  bool
	parked *int
}

// ordered reports whether m's sequence is checked: it has one and the
// Processor is not Config.Unordered.
func (p *Processor) ordered(m *Message) bool { return m.HasSeq() && !p.cfg.Unordered }

// firstStatement is the record's claim of its key, and the move of its
// aggregate's position when it is ordered: one statement.
func (r *recordRun) firstStatement() (string, []any) {
	p, m := r.p, r.m
	if p.ordered(m) {
		return p.sql.ClaimAdvance, []any{p.name, m.AggregateType, m.AggregateID, m.Seq, m.IdempotencyKey}
	}
	return p.sql.ClaimOnly, []any{p.name, m.IdempotencyKey}
}

// apply does the work of the record inside r.tx: claim (unless r.pre says
// the first statement did), order, handle, drain. It does not commit.
func (r *recordRun) apply(ctx context.Context) (Result, error) {
	p, m, tx := r.p, r.m, r.tx
	var (
		c     ordering.Check
		known bool
	)
	if r.pre == nil {
		sql, args := r.firstStatement()
		var c claimed
		if err := tx.QueryRow(ctx, sql, args...).Scan(&c.fresh, &c.parked); err != nil {
			return Result{}, infra(fmt.Errorf("consumer: claim key: %w", err))
		}
		r.pre = &c
	}
	if !r.pre.fresh {
		p.noteDuplicate(ctx, m)
		return Result{Outcome: Duplicate}, nil
	}
	if r.pre.parked != nil {
		c, known = ordering.Check{Verdict: ordering.InOrder, Last: m.Seq - 1, Parked: *r.pre.parked}, true
	}
	if !p.ordered(m) {
		return Result{Outcome: Applied}, r.handle(ctx)
	}
	agg := m.aggregate()
	if !known {
		var err error
		if c, err = p.ordering.Check(ctx, tx, agg, m.Seq); err != nil {
			return Result{}, infra(err)
		}
	}
	switch c.Verdict {
	case ordering.Duplicate:
		if p.cfg.GapPolicy == ordering.GapIgnore {
			// Ignore: a late record is applied; dedupe vouched for it.
			return Result{Outcome: Applied}, r.handle(ctx)
		}
		reused := &SequenceReusedError{Aggregate: agg, Seq: m.Seq, Position: c.Last}
		if p.cfg.FirstSeen == ordering.FirstSeenBaseline && !m.Replayed {
			// The baseline skips what came before the consumer joined,
			// which a late record below it may be; say so, and skip it.
			p.log.InfoContext(ctx, "consumer: record below its aggregate's position skipped under FirstSeenBaseline",
				slog.String("reason", reused.Error()))
			return Result{Outcome: Duplicate}, nil
		}
		// The key was fresh, so this is not a redelivery of the event
		// that took this sequence: a different event reuses it.
		return Result{}, Permanent(reused)
	case ordering.Gap:
		if c.Held || p.cfg.GapPolicy == ordering.GapPark {
			ok, err := p.ordering.Park(ctx, tx, agg, m.Seq, m.Record, m.IdempotencyKey)
			if err != nil {
				return Result{}, infra(err)
			}
			if !ok {
				// The key was fresh, so the record parked at this
				// sequence is another event.
				return Result{}, Permanent(&SequenceReusedError{Aggregate: agg, Seq: m.Seq, Position: c.Last, Parked: true})
			}
			p.log.InfoContext(ctx, "consumer: record parked behind a gap", slog.String("aggregate", agg.String()),
				slog.Int64("seq", m.Seq), slog.Int64("want_seq", c.Last+1), slog.Bool("held_by_dead_letter", c.Held))
			return Result{Outcome: Parked}, nil
		}
		if p.cfg.GapPolicy == ordering.GapFail {
			return Result{}, &ordering.GapError{Aggregate: agg, Want: c.Last + 1, Got: m.Seq}
		}
		p.log.WarnContext(ctx, "consumer: gap ignored", slog.String("aggregate", agg.String()),
			slog.Int64("seq", m.Seq), slog.Int64("want_seq", c.Last+1))
		if err := r.handle(ctx); err != nil {
			return Result{}, err
		}
		if _, _, err := p.ordering.SkipTo(ctx, tx, agg, m.Seq); err != nil {
			return Result{}, infra(err)
		}
		return Result{Outcome: Applied}, nil
	}
	if err := r.handle(ctx); err != nil {
		return Result{}, err
	}
	res := Result{Outcome: Applied}
	if c.Parked > 0 {
		n, err := p.drain(ctx, tx, agg)
		if err != nil {
			return Result{}, err
		}
		res.Drained = n
	}
	return res, nil
}

// handle runs the handler for the record in r.tx, and counts the run.
func (r *recordRun) handle(ctx context.Context) error {
	r.handlerRuns++
	return r.p.call(ctx, r.tx, r.m)
}

// call runs the handler with Config.HandlerTimeout, turning a panic into a
// *PanicError and a handler that ran out of its time into a
// *HandlerTimeoutError.
func (p *Processor) call(ctx context.Context, tx pgx.Tx, m *Message) error {
	hctx, cancel := p.handlerContext(ctx)
	defer cancel()
	err := p.callHandler(hctx, tx, m)
	return p.timedOut(ctx, hctx, err)
}

// handlerContext is ctx with Config.HandlerTimeout, when there is one.
func (p *Processor) handlerContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if p.cfg.HandlerTimeout < 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, p.cfg.HandlerTimeout)
}

// timedOut wraps err in a *HandlerTimeoutError when the handler's context
// hctx ran out of time while ctx, its parent, did not.
func (p *Processor) timedOut(ctx, hctx context.Context, err error) error {
	if err != nil && ctx.Err() == nil && errors.Is(hctx.Err(), context.DeadlineExceeded) {
		return &HandlerTimeoutError{Timeout: p.cfg.HandlerTimeout, Err: err}
	}
	return err
}

func (p *Processor) callHandler(ctx context.Context, tx pgx.Tx, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return p.h.Handle(ctx, tx, m)
}

func (p *Processor) letter(m *Message, err error, attempts int) *deadletter.Letter {
	l := &deadletter.Letter{
		Consumer: p.name, Record: m.Record, IdempotencyKey: m.IdempotencyKey,
		AggregateType: m.AggregateType, AggregateID: m.AggregateID, Seq: m.Seq,
		Error: err.Error(), Attempts: attempts,
	}
	l.Reason, l.Failure = fingerprint(err, attempts)
	var pe *PanicError
	if errors.As(err, &pe) {
		l.Stack = string(pe.Stack)
	}
	return l
}

// deadLetter writes the record to the dead-letter table for cause, in a
// transaction of its own, with the handler's runs as its attempts, and,
// when it is sequenced, holds its aggregate so that later records park
// behind it. A record that is already dealt with is a Duplicate instead:
// its key is claimed (it was applied, or its letter discarded or replayed),
// or its letter was resolved. So a malformed record that comes back does
// not raise its letter from the dead.
func (r *recordRun) deadLetter(ctx context.Context, cause error) (Result, error) {
	p, m, attempts := r.p, r.m, r.handlerRuns
	var (
		id  int64
		dup bool
	)
	err := pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error {
		if m.IdempotencyKey != "" {
			claimed, err := p.dedupe.Claimed(ctx, tx, m.IdempotencyKey)
			if err != nil || claimed {
				dup = claimed
				return err
			}
		}
		var err error
		if id, err = p.dead.Put(ctx, tx, p.letter(m, cause, attempts)); err != nil {
			if errors.Is(err, deadletter.ErrResolved) {
				dup = true
				return nil
			}
			return err
		}
		if p.ordered(m) {
			return p.ordering.Hold(ctx, tx, m.aggregate(), m.Seq)
		}
		return nil
	})
	if err != nil {
		return Result{}, infra(fmt.Errorf("consumer: dead-letter record %s/%d@%d: %w", m.Topic, m.Partition, m.Offset, err))
	}
	if dup {
		p.log.InfoContext(ctx, "consumer: failed record was dealt with before; skipped as a duplicate",
			slog.String("topic", m.Topic), slog.Int("partition", int(m.Partition)), slog.Int64("offset", m.Offset),
			slog.String("error", cause.Error()))
		return Result{Outcome: Duplicate, Attempts: attempts}, nil
	}
	p.log.ErrorContext(ctx, "consumer: record dead-lettered",
		slog.String("topic", m.Topic), slog.Int("partition", int(m.Partition)), slog.Int64("offset", m.Offset),
		slog.Int64("dead_letter_id", id), slog.Int("attempts", attempts), slog.String("error", cause.Error()))
	return Result{Outcome: DeadLettered, DeadLetterID: id, Attempts: attempts, Err: cause}, nil
}

// track records tx as open until the returned function runs, in the set
// ctx carries (see withOpenSet), if any, and in the sets that set is part
// of, by the server pid of its transaction (pgpipeline.ServerPID), which
// behind a pooler is not the connection's start-up pid; 0 when it could
// not be read.
func track(ctx context.Context, tx pgx.Tx) func() {
	pid := pgpipeline.ServerPID(ctx, tx)
	s, _ := ctx.Value(openKey{}).(*openSet)
	if s == nil {
		return func() {}
	}
	return s.add(pid)
}

// openSet counts the open transactions of each database session (backend
// pid), for Run to end the sessions of the ones it abandons. A set may be
// part of a larger one (parent), which counts its transactions too: a
// lane's set is part of its Consumer's.
type openSet struct {
	parent *openSet
	mu     sync.Mutex
	m      map[uint32]int
}

// add counts a transaction open on pid, in s and the sets it is part of,
// until the returned function runs.
func (s *openSet) add(pid uint32) func() {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[uint32]int{}
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
func (s *openSet) pids() []uint32 {
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
func endSessions(ctx context.Context, db DB, log *slog.Logger, pids []uint32) error {
	if len(pids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ids := make([]int64, 0, len(pids))
	for _, pid := range pids {
		if pid != 0 {
			ids = append(ids, int64(pid))
		}
	}
	if len(ids) < len(pids) {
		log.WarnContext(ctx, "consumer: cannot end the sessions of abandoned transactions whose server pid could not be read; "+
			"the server's idle_in_transaction_session_timeout (or the pooler's idle_transaction_timeout) must bound them")
	}
	if len(ids) == 0 {
		return nil
	}
	_, err := db.Exec(ctx, `SELECT pg_terminate_backend(pid::integer) FROM unnest($1::bigint[]) AS pid`, ids)
	return err
}

// backoff is the wait before retry number attempt (1 for the first) of a
// record, within Config.MinBackoff and Config.MaxBackoff: the Processor's
// retries and the Consumer's of a record that is not done wait alike.
func (c *Config) backoff(attempt int) time.Duration {
	return backoff.Policy{Min: c.MinBackoff, Max: c.MaxBackoff}.Delay(attempt)
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
