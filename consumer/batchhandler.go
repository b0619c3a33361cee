package consumer

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"

	"github.com/jackc/pgx/v5"
)

// BatchHandler is a Handler that can also apply several messages in one
// call, for batch mode (Config.BatchSize above 1, or ProcessBatch): a
// handler that writes each message's effect with a statement of its own
// spends a round trip per message, and one multi-row statement for the
// whole batch removes them. Give Handle or New a handler that implements
// it and batch mode calls HandleBatch instead of Handle on its happy path.
//
// ms holds exactly the messages the happy path applies: the batch's
// records without those whose key was claimed before (duplicates), in the
// order they are to be applied. Each partition's messages are in offset
// order and each aggregate's in sequence order, without a hole; on the
// Consumer's path that puts a small poll in one transaction (see
// Config.BatchSize), ms holds messages of several partitions. ms is never
// empty. Their keys are claimed and their aggregates' positions moved in tx
// before HandleBatch runs.
//
// HandleBatch must have exactly the effect of calling Handle for each
// message of ms in that order, all in tx: the records are applied by
// HandleBatch in a batch and by Handle everywhere else (Process, a batch
// that left the happy path, parked records drained, Replay), and which one
// applies a record must not matter.
//
// An error or a panic from HandleBatch rolls the whole transaction back, and
// the batch's records are then run one by one, each in its own
// transaction, through Handle, which retries, parks and dead-letters each
// record alone: a failing record is dead-lettered alone, after
// Config.MaxAttempts runs of Handle, and the others are applied once.
// HandleBatch's failure is not counted as any record's attempt (it cannot
// be attributed to one), and Permanent means nothing from it. A HandleBatch
// that always fails costs throughput, never correctness. Work outside the
// database (an email, an HTTP call) is not undone by the rollback and may
// happen more than once: in HandleBatch and then again in Handle.
type BatchHandler interface {
	Handler
	HandleBatch(ctx context.Context, tx pgx.Tx, ms []*Message) error
}

// handleAll runs the handler for the messages of a batch's happy path,
// those whose result is Applied: HandleBatch once when the handler is a
// BatchHandler, else Handle for each in order. On an error, failed is the
// message whose Handle failed, or nil when HandleBatch did.
func (p *Processor) handleAll(ctx context.Context, tx pgx.Tx, msgs []*Message, res []Result) (failed *Message, err error) {
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
	return nil, p.callBatch(ctx, tx, ms)
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
			return // not the batch's fault; batchOnce says so
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
