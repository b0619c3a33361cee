package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/deadletter"
)

// deadLetterRecord writes rec to the dead-letter table for cause, without
// running its handler: the share group runner's seam for a record it
// cannot finish on its last delivery. A routing Processor writes it in
// the record's target, or in the fallback target when it has none.
func (p *Processor) deadLetterRecord(ctx context.Context, rec *kgo.Record, cause error) (Result, error) {
	if p.route != nil {
		t, err := p.route.ownerOf(aggregateOf(rec))
		if err != nil {
			t = p.route.fallback
		}
		return t.deadLetterRecord(ctx, rec, cause)
	}
	m, _ := parse(rec, p.cfg.KeyFunc, p.cfg.MaxValueBytes)
	return p.newRun(m).deadLetter(ctx, cause)
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
		var conflict *ConflictingDuplicateError
		if m.IdempotencyKey != "" && !errors.As(cause, &conflict) {
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
