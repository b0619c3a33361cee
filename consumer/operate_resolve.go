package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

// Replay applies the open dead letter id again, in one transaction, through
// the same path as a fresh record: the key is claimed, the sequence checked,
// the handler run once (no retries: the operator sees the error), and the
// successors parked behind it drained in order: the first 50 in the same
// transaction, the rest afterwards by DrainReady (which [Consumer.Run] calls;
// Replay does not wait for them). The letter is marked
// replayed in the same transaction, so a replay that succeeds applies the
// effect exactly once (within the consumer's database), and one that fails
// changes nothing. The record is parsed again with the current Config, so a
// fix to KeyFunc takes effect.
//
// A record whose key was claimed meanwhile (it was redelivered and
// succeeded) is a Duplicate and just marked replayed. One whose aggregate
// still misses earlier sequences is refused with ErrNotNext, as Discard
// refuses it: resolve the earlier gap first.
//
// On a routing Processor, call Replay on the target that holds the letter
// (Target); one that owns no more the letter's aggregate refuses it.
func (p *Processor) Replay(ctx context.Context, id int64) (Result, error) {
	if p.route != nil {
		return Result{}, errRouting("Replay")
	}
	var res Result
	e := p.entry(ctx, operator.Replay, id, ordering.Aggregate{})
	replay := func(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) error {
		e.AggregateType, e.AggregateID = l.AggregateType, l.AggregateID
		if l.Consumer != p.name {
			return fmt.Errorf("consumer: dead letter %d belongs to consumer %q, not %q: %w", id, l.Consumer, p.name, ErrWrongConsumer)
		}
		m, err := parse(l.Record, p.cfg.KeyFunc, p.cfg.MaxValueBytes)
		if err != nil {
			return fmt.Errorf("consumer: replay %d: %w", id, err)
		}
		if err := p.checkOwner(id, m); err != nil {
			return err
		}
		m.Attempt, m.Replayed = 1, true
		run := p.newRun(m)
		run.tx = tx
		r, err := run.apply(ctx)
		var reused *SequenceReusedError
		if errors.As(err, &reused) && !reused.Parked {
			return fmt.Errorf("consumer: replay %d: its aggregate %s is at %d, past the letter's sequence %d (skipped by ResolveGap or applied by another event); nothing was applied: discard the letter instead: %w",
				id, reused.Aggregate, reused.Position, reused.Seq, ErrSequencePassed)
		}
		if err != nil {
			return fmt.Errorf("consumer: replay %d: %w", id, err)
		}
		if r.Outcome == Parked {
			// Marked replayed, the parked record would have no letter to
			// go back to if its handler failed again in a drain.
			last, _, err := p.ordering.Position(ctx, tx, m.aggregate())
			if err != nil {
				return err
			}
			return fmt.Errorf("consumer: replay %d: its aggregate %s is at %d and still misses the sequences up to %d; nothing was applied: resolve that gap first (ResolveGap stops below this letter): %w",
				id, m.aggregate(), last, m.Seq-1, ErrNotNext)
		}
		if run.handlerRuns > 0 {
			r.Attempts = 1
		}
		res = r
		outcome, delta := operator.OutcomeApplied, operator.Progress{Applied: 1, Drained: int64(r.Drained)}
		if r.Outcome == Duplicate {
			outcome, delta = operator.OutcomeDuplicate, operator.Progress{Duplicates: 1, Drained: int64(r.Drained)}
		}
		if err := p.audit(ctx, tx, e, outcome, drainedDetail(r.Drained)); err != nil {
			return err
		}
		return p.countRequest(ctx, tx, delta)
	}
	err := p.releasing(func() error { return p.dead.Replay(ctx, p.db, id, replay) })
	if err != nil {
		p.auditFailure(ctx, e, err)
		return Result{}, err
	}
	p.log.InfoContext(ctx, "consumer: dead letter replayed", "dead_letter_id", id, "outcome", res.Outcome.String(), "drained", res.Drained)
	p.afterRelease(res.Drained)
	return res, nil
}

// Discard gives up on the open dead letter id for good: its key is claimed
// (so a redelivery is skipped as a duplicate), and when it is sequenced its
// aggregate's position moves past it as if it had been applied, releasing
// the successors parked behind it, which are applied in order: the first 50
// in the same transaction, the rest afterwards by DrainReady, as for
// Replay. It returns how many it applied itself.
//
// On a routing Processor, call Discard on the target that holds the
// letter (Target).
func (p *Processor) Discard(ctx context.Context, id int64) (int, error) {
	if p.route != nil {
		return 0, errRouting("Discard")
	}
	drained := 0
	e := p.entry(ctx, operator.Discard, id, ordering.Aggregate{})
	discard := func(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) error {
		e.AggregateType, e.AggregateID = l.AggregateType, l.AggregateID
		if err := p.discard(ctx, tx, id, l, &drained); err != nil {
			return err
		}
		if err := p.audit(ctx, tx, e, operator.OutcomeDiscarded, drainedDetail(drained)); err != nil {
			return err
		}
		return p.countRequest(ctx, tx, operator.Progress{Discarded: 1, Drained: int64(drained)})
	}
	err := p.releasing(func() error { return p.dead.Discard(ctx, p.db, id, discard) })
	if err != nil {
		p.auditFailure(ctx, e, err)
		return 0, err
	}
	p.log.InfoContext(ctx, "consumer: dead letter discarded", "dead_letter_id", id, "drained", drained)
	p.afterRelease(drained)
	return drained, nil
}

// discard is Discard's work on letter l in tx; it sets drained to how many
// successors it applied.
func (p *Processor) discard(ctx context.Context, tx pgx.Tx, id int64, l *deadletter.Letter, drained *int) error {
	if l.Consumer != p.name {
		return fmt.Errorf("consumer: dead letter %d belongs to consumer %q, not %q: %w", id, l.Consumer, p.name, ErrWrongConsumer)
	}
	if l.IdempotencyKey != "" {
		if _, err := p.dedupe.Claim(ctx, tx, l.IdempotencyKey); err != nil {
			return err
		}
	}
	if l.Seq == 0 {
		return nil
	}
	agg := ordering.Aggregate{Type: l.AggregateType, ID: l.AggregateID}
	last, _, err := p.ordering.Position(ctx, tx, agg)
	if err != nil {
		return err
	}
	if last >= l.Seq {
		return nil // already past it
	}
	if last < l.Seq-1 {
		return fmt.Errorf("consumer: discard %d (seq %d of %s, position %d): %w", id, l.Seq, agg, last, ErrNotNext)
	}
	if _, _, err := p.ordering.SkipTo(ctx, tx, agg, l.Seq); err != nil {
		return err
	}
	*drained, err = p.drain(ctx, tx, agg, false)
	return err
}

// ResolveGap gives up on the missing sequences of agg's open gap (those
// below its lowest parked record) and applies the parked records that are
// then in line: the first 50 in one transaction, the rest afterwards by
// DrainReady, as for Replay. It returns how many records it applied itself. It never skips an open dead letter: when the gap starts with
// one, it refuses (replay or discard that letter instead), and when one
// lies further inside the gap, it skips only the missing sequences below
// the letter and stops there, applying nothing; the letter is then next in
// line, for Replay or Discard.
//
// A routing Processor resolves the gap in the target that owns agg.
func (p *Processor) ResolveGap(ctx context.Context, agg ordering.Aggregate) (int, error) {
	if p.route != nil {
		return p.route.resolveGap(ctx, agg)
	}
	var (
		n     int
		found *ordering.OpenGap
		to    int64
	)
	e := p.entry(ctx, operator.ResolveGap, 0, agg)
	resolve := func(tx pgx.Tx) error {
		var err error
		if found, err = p.ordering.Gap(ctx, tx, agg); err != nil {
			return err
		}
		if found == nil {
			return fmt.Errorf("consumer: %s: %w", agg, ErrNoGap)
		}
		to = found.FirstParked - 1
		if found.DeadLetterID != 0 {
			if found.DeadLetterSeq == found.Expected {
				return &GapHeldError{Aggregate: agg, DeadLetterID: found.DeadLetterID, Seq: found.DeadLetterSeq}
			}
			to = found.DeadLetterSeq - 1
		}
		moved, _, err := p.ordering.SkipTo(ctx, tx, agg, to)
		if err != nil {
			return err
		}
		if moved && to >= found.FirstParked-1 {
			if n, err = p.drain(ctx, tx, agg, false); err != nil {
				return err
			}
		}
		detail := fmt.Sprintf("skipped %d..%d, %s", found.Expected, to, drainedDetail(n))
		if found.DeadLetterID != 0 {
			detail += fmt.Sprintf(", stopped at dead letter %d", found.DeadLetterID)
		}
		if err := p.audit(ctx, tx, e, operator.OutcomeResolved, detail); err != nil {
			return err
		}
		return p.countRequest(ctx, tx, operator.Progress{Drained: int64(n)})
	}
	err := p.releasing(func() error { return pgx.BeginFunc(ctx, p.db, resolve) })
	if err != nil {
		p.auditFailure(ctx, e, err)
		return 0, err
	}
	attrs := []any{"aggregate", agg.String(), "skipped_from", found.Expected, "skipped_to", to, "drained", n}
	if found.DeadLetterID != 0 {
		attrs = append(attrs, "stopped_at_dead_letter", found.DeadLetterID)
	}
	p.log.WarnContext(ctx, "consumer: gap resolved by skipping", attrs...)
	p.afterRelease(n)
	return n, nil
}

// afterRelease wakes the drainer when an operator action drained a full
// chunk: more successors may be in line, and the action does not wait for
// them.
func (p *Processor) afterRelease(drained int) {
	if drained == drainChunk {
		p.readyToDrain()
	}
}

// releasing runs op, an operator action's transaction that releases
// parked records, once more when a successor's handler ran past
// [Config.HandlerTimeout] and took op's transaction with it
// (drainLostError): that try counted against the successor, which the
// second run leaves in line, and the drainer that DrainReady runs tries it
// in a transaction of its own until it applies or is dead-lettered. The
// action itself is not failed for a successor's fault.
func (p *Processor) releasing(op func() error) error {
	err := op()
	var lost *drainLostError
	if errors.As(err, &lost) {
		p.log.Warn("consumer: a released parked record ran past Config.HandlerTimeout and took the transaction with it; its try counts toward MaxAttempts, it is left in line for DrainReady, and the action is run again",
			slog.String("aggregate", lost.agg.String()), slog.Int64("seq", lost.seq), slog.Int("attempt", lost.tries), slog.String("error", lost.cause.Error()))
		err = op()
		p.readyToDrain()
	}
	return err
}
