package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/internal/pgpipeline"
	"github.com/d419a114/outbox/internal/sequence"
	"github.com/d419a114/outbox/ordering"
)

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
	// contended is when the record's failures that contention also causes
	// began, zero when the last failure was not one; see riding.
	contended time.Time
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
			class = p.judge(ctx, p.db, classify(err), err, m)
			switch class {
			case classTransient:
				if r.transient++; r.transient >= p.cfg.MaxAttempts {
					return Result{}, err
				}
				tries = r.transient
			case classData:
				return r.deadLetter(ctx, err)
			default:
				riding := p.riding(&r.contended, err)
				if r.attempt >= p.cfg.MaxAttempts && !riding || IsPermanent(err) {
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
			if res.Drained == drainChunk || p.ordered(m) && p.faults.pending(m.aggregate()) {
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
	defer track(ctx, r.p, tx)()
	r.tx, r.pre = tx, &pre
	defer func() { r.tx, r.pre = nil, nil }()
	res, err := r.apply(ctx)
	if err != nil {
		return Result{}, connectionLost(tx, err)
	}
	if err := tx.Commit(ctx); err != nil {
		// A commit can fail because of the handler's deferred constraints
		// or because the connection broke; either way the record is tried
		// again and dedupe sorts out a commit that did land. The COMMIT is
		// the SDK's own statement: a serialization failure, a deadlock or
		// any other SQLSTATE that contention or an outage causes there is
		// retried without counting; only a deferred constraint's error
		// (any other SQLSTATE) counts against the record.
		err = fmt.Errorf("consumer: commit: %w", err)
		if classify(err) == classSuspect {
			err = infra(err)
		}
		return Result{}, connectionLost(tx, err)
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

// firstStatement is the record's claim of its key, and the move of its
// aggregate's position when it is ordered: one statement.
func (r *recordRun) firstStatement() (string, []any) {
	p, m := r.p, r.m
	if p.ordered(m) {
		return p.sql.ClaimAdvance, []any{p.name, m.AggregateType, m.AggregateID, m.Seq, m.IdempotencyKey, m.identity()}
	}
	return p.sql.ClaimOnly, []any{p.name, m.IdempotencyKey, m.identity()}
}

// apply does the work of the record inside r.tx: claim (unless r.pre says
// the first statement did), order, handle, drain. It does not commit.
func (r *recordRun) apply(ctx context.Context) (Result, error) {
	p, m, tx := r.p, r.m, r.tx
	var (
		c     sequence.Check
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
		if err := r.checkIdentity(ctx); err != nil {
			return Result{}, err
		}
		p.noteDuplicate(ctx, m)
		return Result{Outcome: Duplicate}, nil
	}
	if r.pre.parked != nil {
		c, known = sequence.Check{Verdict: sequence.InOrder, Last: m.Seq - 1, Parked: *r.pre.parked}, true
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
	case sequence.Duplicate:
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
	case sequence.Gap:
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
		n, err := p.drain(ctx, tx, agg, false)
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

// checkIdentity compares the identity stored with the record's claimed key
// to the record's own: a different one is a conflicting duplicate, a
// permanent failure, never a silent skip. A key stored without an identity
// (claimed before version 15, or by a batch or dedupe.Store) is a plain
// duplicate.
func (r *recordRun) checkIdentity(ctx context.Context) error {
	var stored *string
	if err := r.tx.QueryRow(ctx, r.p.sql.ClaimedIdentity, r.p.name, r.m.IdempotencyKey).Scan(&stored); err != nil {
		return infra(fmt.Errorf("consumer: read claimed key's identity: %w", err))
	}
	if got := r.m.identity(); stored != nil && *stored != got {
		return Permanent(&ConflictingDuplicateError{Key: r.m.IdempotencyKey, Stored: *stored, Got: got})
	}
	return nil
}
