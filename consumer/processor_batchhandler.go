package consumer

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"

	"github.com/jackc/pgx/v5"
)

// BatchHandler is a Handler that can also apply several messages in one
// call, for batch mode (ProcessBatch, or [Config.BatchSize] above 1 for the
// Consumer): a handler that writes each message's effect with a statement
// of its own spends a round trip per message, and one multi-row statement
// for the whole batch saves them. Give Handle or New a handler that
// implements it, and batch mode's happy path calls HandleBatch once instead
// of Handle for each message.
//
// ms holds exactly the messages the happy path applies, in the order they
// are applied: the batch's records less the duplicates (keys claimed
// before, or earlier in the batch), in offset order, each aggregate's in
// sequence order without a hole. On the Consumer's path they are all of one
// partition. ms is never empty. The messages' keys are claimed and their aggregates' positions
// moved in tx before HandleBatch runs.
//
// HandleBatch must have exactly the effect of calling Handle for each
// message of ms in that order, all in tx: a record is applied by HandleBatch
// in a batch and by Handle everywhere else (Process, a batch that left the
// happy path, parked records drained, Replay), and which one applied it
// must not matter.
//
// An error or a panic from HandleBatch rolls the whole transaction back, and
// the batch's records are then run one by one, each in a transaction of its
// own, through Handle, which retries, parks and dead-letters each record
// alone: a failing record is dead-lettered alone, after its retries, and
// the others are applied once. HandleBatch's failure is counted as no
// record's attempt (it cannot be attributed to one), and Permanent means
// nothing from it; a HandleBatch that keeps failing costs throughput, never
// correctness. When ctx ends or tx's connection is lost instead, the batch
// is handed back undone, as ProcessBatch says. Work outside the database
// (an email, an HTTP call) is not undone by the rollback and may happen
// more than once: in HandleBatch, then again in Handle.
type BatchHandler interface {
	Handler
	HandleBatch(ctx context.Context, tx pgx.Tx, ms []*Message) error
}

// handleAll runs the handler in b.tx for the messages of the batch's
// happy path, those whose result is Applied: HandleBatch once when the
// handler is a BatchHandler, else Handle for each in order. On an error,
// failed is the message whose Handle failed, or nil when HandleBatch did.
func (b *batchRun) handleAll(ctx context.Context) (failed *Message, err error) {
	p, tx, msgs, res := b.p, b.tx, b.msgs, b.res
	if p.bh == nil {
		for i, m := range msgs {
			if res[i].Outcome != Applied {
				continue
			}
			if err := p.call(ctx, tx, m); err != nil {
				return m, err
			}
		}
		return nil, nil
	}
	ms := make([]*Message, 0, len(msgs))
	for i, m := range msgs {
		if res[i].Outcome == Applied {
			ms = append(ms, m)
		}
	}
	if len(ms) == 0 {
		return nil, nil
	}
	hctx, cancel := p.handlerContext(ctx)
	defer cancel()
	err = p.callBatch(hctx, tx, ms)
	return nil, p.timedOut(ctx, hctx, err)
}

// callBatch runs HandleBatch, turning a panic into a *PanicError. A
// failure is logged here, with the panic's stack: the records' own runs
// through Handle may well succeed, and then nothing else would tell of it.
func (p *Processor) callBatch(ctx context.Context, tx pgx.Tx, ms []*Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
		if err == nil || ctx.Err() != nil || tx.Conn().IsClosed() {
			return // nothing failed, or not for the batch: batchRun.once hands it back
		}
		attrs := []any{slog.Int("messages", len(ms)), slog.String("error", err.Error())}
		var pe *PanicError
		if errors.As(err, &pe) {
			attrs = append(attrs, slog.String("stack", string(pe.Stack)))
		}
		p.log.WarnContext(ctx, "consumer: batch handler failed, applying the batch's records one by one", attrs...)
	}()
	return p.bh.HandleBatch(ctx, tx, ms)
}
