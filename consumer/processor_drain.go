package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/internal/sequence"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

// drainChunk bounds the parked records one transaction drains. Each takes a
// savepoint, and past 64 subtransactions in one transaction PostgreSQL
// slows every session's snapshots; a long-held aggregate is released in
// transactions of drainChunk records that each resume where the last one
// stopped.
const drainChunk = 50

// drain applies up to drainChunk of agg's parked records that are now in
// line, each in a savepoint with its own retries, so that a failing
// successor is dead-lettered alone (in tx) and holds the rest, instead of
// undoing the record that released it. Draining is rare; the savepoints
// cost nothing on the hot path. When it returns drainChunk, more may be in
// line: drainRest takes them in transactions of their own.
//
// A successor whose handler ran past [Config.HandlerTimeout] took tx's
// connection with it (pgx closes it): drain returns a *drainLostError, and
// the try counts against that successor in p.faults. In a later tx that
// releases it, the successor is put back, in line, and left to drainOnce;
// alone is set by drainOnce, whose tx drains nothing else first, and
// there it is tried again, or dead-lettered without another run once its
// tries reach MaxAttempts.
func (p *Processor) drain(ctx context.Context, tx pgx.Tx, agg ordering.Aggregate, alone bool) (int, error) {
	first := true
	return p.ordering.Drain(ctx, tx, agg, drainChunk, func(ctx context.Context, pk *ordering.Parked) error {
		lost := p.faults.get(agg, pk.Seq)
		if lost != nil && (!alone || !first) {
			// Leave it in line for drainOnce, which p.faults.pending
			// tells to run.
			if _, err := p.ordering.Park(ctx, tx, agg, pk.Seq, pk.Record, pk.IdempotencyKey); err != nil {
				return infra(err)
			}
			return sequence.ErrStopDrain
		}
		first = false
		m, perr := parse(pk.Record, p.cfg.KeyFunc, p.cfg.MaxValueBytes)
		m.IdempotencyKey = pk.IdempotencyKey
		m.Seq, m.AggregateType, m.AggregateID = pk.Seq, agg.Type, agg.ID
		herr, runs, start := perr, 0, 1
		var contended time.Time
		if lost != nil {
			runs, start = lost.tries, lost.tries+1
			if lost.tries >= p.cfg.MaxAttempts {
				herr = lost.cause
			}
		}
		for attempt := start; herr == nil; attempt++ {
			m.Attempt = attempt
			sp, err := tx.Begin(ctx)
			if err != nil {
				return infra(fmt.Errorf("consumer: open savepoint: %w", err))
			}
			runs++
			if herr = p.call(ctx, sp, m); herr == nil {
				if err := sp.Commit(ctx); err != nil {
					return infra(fmt.Errorf("consumer: release savepoint: %w", err))
				}
				p.faults.clear(agg, m.Seq)
				return nil
			}
			if err := sp.Rollback(ctx); err != nil {
				var te *HandlerTimeoutError
				if errors.As(herr, &te) && tx.Conn().IsClosed() {
					// Its own deadline closed the connection: its
					// fault, and nothing here can be saved.
					return infra(p.faults.add(agg, m.Seq, herr))
				}
				return infra(fmt.Errorf("consumer: roll back to savepoint: %w", err))
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if p.judge(ctx, tx, classify(herr), herr, m) == classTransient {
				// Not the parked record's fault: undo the whole
				// transaction and hand the releasing record back.
				return infra(fmt.Errorf("consumer: drain %s seq %d: %w", agg, m.Seq, herr))
			}
			riding := p.riding(&contended, herr)
			if attempt >= p.cfg.MaxAttempts && !riding || IsPermanent(herr) {
				break
			}
			if err := sleep(ctx, p.cfg.backoff(attempt)); err != nil {
				return err
			}
			herr = nil
		}
		// Give up on it inside tx: out of parked, into dead letters, and its
		// key released so that a replay can claim it.
		id, err := p.dead.Put(ctx, tx, p.letter(m, herr, runs))
		if err != nil {
			return infra(err)
		}
		if m.IdempotencyKey != "" {
			if err := p.dedupe.Release(ctx, tx, m.IdempotencyKey); err != nil {
				return infra(err)
			}
		}
		p.log.ErrorContext(ctx, "consumer: parked record dead-lettered", slog.String("aggregate", agg.String()),
			slog.Int64("seq", m.Seq), slog.Int64("dead_letter_id", id), slog.Int("attempts", runs), slog.String("error", herr.Error()))
		// Forgotten before tx commits: should it roll back, the record
		// is parked again and counts from zero, which is the safe side.
		p.faults.clear(agg, m.Seq)
		return sequence.ErrStopDrain
	})
}

// drainRest applies the rest of agg's in-line parked records after a drain
// that stopped at drainChunk, one transaction per chunk, until a chunk
// comes back short. It returns how many it applied.
func (p *Processor) drainRest(ctx context.Context, agg ordering.Aggregate) (int, error) {
	total := 0
	for {
		n, err := p.drainOnce(ctx, agg)
		total += n
		var lost *drainLostError
		if errors.As(err, &lost) {
			// Its try counted; the next chunk starts with it again,
			// until it applies or is dead-lettered.
			p.log.WarnContext(ctx, "consumer: parked record ran past Config.HandlerTimeout in a drain; its try counts toward MaxAttempts",
				slog.String("aggregate", agg.String()), slog.Int64("seq", lost.seq), slog.Int("attempt", lost.tries), slog.String("error", lost.cause.Error()))
			if err := sleep(ctx, p.cfg.backoff(lost.tries)); err != nil {
				return total, err
			}
			continue
		}
		if err != nil || n == 0 || n < drainChunk && !p.faults.pending(agg) {
			return total, err
		}
	}
}

// drainOnce drains one chunk of agg in a transaction of its own, holding
// the aggregate's position so that it does not race a record of the
// aggregate being processed meanwhile.
func (p *Processor) drainOnce(ctx context.Context, agg ordering.Aggregate) (int, error) {
	n := 0
	err := pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error {
		defer track(ctx, p, tx)()
		ok, err := p.ordering.Lock(ctx, tx, agg)
		if err != nil || !ok {
			return err
		}
		if n, err = p.drain(ctx, tx, agg, true); err != nil || n == 0 {
			return err
		}
		// Draining after an operator request's letter counts for it.
		return p.countRequest(ctx, tx, operator.Progress{Drained: int64(n)})
	})
	if err != nil {
		return 0, fmt.Errorf("consumer: drain parked records of %s: %w", agg, err)
	}
	return n, nil
}

// DrainReady applies the parked records that are next in line while no
// transaction drains them, and returns how many it applied. They are left
// by a release too long for one transaction: Replay, Discard and ResolveGap
// apply the first 50 successors and return, and a process that stops
// between two chunks leaves the rest. DrainReady works in transactions of
// at most 50 records each, oldest aggregate first. [Consumer.Run] calls it
// when it starts, after such an operator action in its own process, and
// every minute; a poll loop of one's own around Process should call it as
// well. A routing Processor drains every target, all at once.
func (p *Processor) DrainReady(ctx context.Context) (int, error) {
	if p.route != nil {
		var n atomic.Int64
		err := p.route.each(func(t *Processor) error {
			d, err := t.DrainReady(ctx)
			n.Add(int64(d))
			return err
		})
		return int(n.Load()), err
	}
	total := 0
	for {
		aggs, err := p.ordering.Ready(ctx, p.db, 100)
		if err != nil {
			return total, fmt.Errorf("consumer: %w", err)
		}
		round := 0
		for _, agg := range aggs {
			n, err := p.drainRest(ctx, agg)
			round += n
			if err != nil {
				return total + round, err
			}
		}
		total += round
		if round == 0 {
			return total, nil
		}
	}
}

// readyToDrain tells [Consumer.Run], if one runs with p, that an operator
// action left parked records in line.
func (p *Processor) readyToDrain() {
	select {
	case p.ready <- struct{}{}:
	default:
	}
}

// leftInLine receives when an operator action left parked records in line
// (readyToDrain): [Consumer.Run]'s drainer waits on it.
func (p *Processor) leftInLine() <-chan struct{} { return p.ready }
