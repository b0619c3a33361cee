package consumer

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

type requestKey struct{}

// withRequest returns ctx carrying the operator request r, claimed by
// this process, that an action is carried out for: for its audit row, and
// for countRequest. Only the goroutine carrying r out acts with it.
func withRequest(ctx context.Context, r *operator.Request) context.Context {
	return context.WithValue(ctx, requestKey{}, r)
}

// entry is the audit row of an operator action taken with ctx.
func (p *Processor) entry(ctx context.Context, action operator.Action, letter int64, agg ordering.Aggregate) *operator.Entry {
	var req int64
	if r, _ := ctx.Value(requestKey{}).(*operator.Request); r != nil {
		req = r.ID
	}
	return &operator.Entry{Actor: operator.Actor(ctx), Consumer: p.name, Action: action, RequestID: req, LetterID: letter,
		AggregateType: agg.Type, AggregateID: agg.ID}
}

// countRequest adds delta to the progress of the request ctx carries, if
// any, in tx: the action's transaction, so that the count stands or falls
// with the action. It fails with operator.ErrClaimLost or
// operator.ErrCancelled when the process no longer holds the request, and
// the action then rolls back. It comes last in the transaction: it locks
// the request's row until the commit.
func (p *Processor) countRequest(ctx context.Context, tx pgx.Tx, delta operator.Progress) error {
	r, _ := ctx.Value(requestKey{}).(*operator.Request)
	if r == nil {
		return nil
	}
	return p.ops.Count(ctx, tx, r, delta)
}

// audit writes e with outcome and detail in db: the action's transaction
// when it succeeded, so that the row stands or falls with it.
func (p *Processor) audit(ctx context.Context, db outbox.DB, e *operator.Entry, outcome operator.Outcome, detail string) error {
	e.Outcome, e.Detail = outcome, detail
	return p.ops.Record(ctx, db, e)
}

// auditFailure writes e as failed with err, after the action's
// transaction rolled back; a failure to write it is logged, and the
// action's own error is what the caller gets. A process that no longer
// holds the request it acted for writes nothing: the request is not its
// own any more.
func (p *Processor) auditFailure(ctx context.Context, e *operator.Entry, err error) {
	if fenced(err) || fenced(context.Cause(ctx)) {
		return
	}
	if aerr := p.audit(context.WithoutCancel(ctx), p.db, e, operator.OutcomeFailed, err.Error()); aerr != nil {
		p.log.WarnContext(ctx, "consumer: could not write the audit row of a failed operator action",
			slog.String("action", string(e.Action)), slog.String("action_error", err.Error()), slog.String("error", aerr.Error()))
	}
}

// drainedDetail is the audit detail of an action that released records.
func drainedDetail(n int) string { return fmt.Sprintf("drained %d", n) }
