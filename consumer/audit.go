package consumer

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

type requestKey struct{}

// withRequest returns ctx carrying the id of the operator request an
// action is carried out for, for its audit row.
func withRequest(ctx context.Context, id int64) context.Context {
	return context.WithValue(ctx, requestKey{}, id)
}

// entry is the audit row of an operator action taken with ctx.
func (p *Processor) entry(ctx context.Context, action operator.Action, letter int64, agg ordering.Aggregate) *operator.Entry {
	req, _ := ctx.Value(requestKey{}).(int64)
	return &operator.Entry{Actor: operator.Actor(ctx), Consumer: p.name, Action: action, RequestID: req, LetterID: letter,
		AggregateType: agg.Type, AggregateID: agg.ID}
}

// audit writes e with outcome and detail in db: the action's transaction
// when it succeeded, so that the row stands or falls with it.
func (p *Processor) audit(ctx context.Context, db outbox.DB, e *operator.Entry, outcome, detail string) error {
	e.Outcome, e.Detail = outcome, detail
	return p.ops.Record(ctx, db, e)
}

// auditFailure writes e as failed with err, after the action's
// transaction rolled back; a failure to write it is logged, and the
// action's own error is what the caller gets.
func (p *Processor) auditFailure(ctx context.Context, e *operator.Entry, err error) {
	if aerr := p.audit(context.WithoutCancel(ctx), p.db, e, "failed", err.Error()); aerr != nil {
		p.log.WarnContext(ctx, "consumer: could not write the audit row of a failed operator action",
			slog.String("action", string(e.Action)), slog.String("action_error", err.Error()), slog.String("error", aerr.Error()))
	}
}

// drainedDetail is the audit detail of an action that released records.
func drainedDetail(n int) string { return fmt.Sprintf("drained %d", n) }
