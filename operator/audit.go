package operator

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
)

// Entry is one row of the audit log: an operator action and what came of
// it.
type Entry struct {
	ID       int64
	At       time.Time
	Actor    string
	Consumer string
	Action   Action
	// RequestID is the request the action was carried out for; zero for a
	// Processor method called directly.
	RequestID int64
	// LetterID, AggregateType and AggregateID name what was acted on, as
	// far as the action names it.
	LetterID                   int64
	AggregateType, AggregateID string
	// Outcome is what came of the action.
	Outcome Outcome
	// Detail is the rest: the error, the filter, how many were drained.
	Detail string
}

// Outcome is what came of an operator action, one word in the audit log.
type Outcome string

const (
	// OutcomeRequested is a request submitted ([Store.Submit]); the process
	// that carries it out writes a row per action it takes.
	OutcomeRequested Outcome = "requested"
	// OutcomeCancelled is a request cancelled ([Store.Cancel]) before it
	// ended.
	OutcomeCancelled Outcome = "cancelled"
	// OutcomeApplied is a dead letter replayed whose record was applied.
	OutcomeApplied Outcome = "applied"
	// OutcomeDuplicate is a dead letter replayed whose record had been
	// applied already (its key was claimed): the letter is resolved and
	// nothing was applied again.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeReplayed is a producer's dead event put back into the outbox
	// (ReplayEvent from the command line, Replay from the dashboard).
	OutcomeReplayed Outcome = "replayed"
	// OutcomeDiscarded is a dead letter or dead event given up on.
	OutcomeDiscarded Outcome = "discarded"
	// OutcomeResolved is a gap resolved (ResolveGap): the aggregate's
	// parked records were released past it.
	OutcomeResolved Outcome = "resolved"
	// OutcomeFailed is an action that failed and changed nothing;
	// [Entry.Detail] holds its error.
	OutcomeFailed Outcome = "failed"
)

// Record writes e (ID and At are set by the database). Given the action's
// own transaction, the row stands or falls with the action.
func (s *Store) Record(ctx context.Context, db outbox.DB, e *Entry) error {
	if _, err := db.Exec(ctx, s.sql.Record, e.Actor, e.Consumer, string(e.Action), nullID(e.RequestID), nullID(e.LetterID),
		tables.Filter(e.AggregateType), tables.Filter(e.AggregateID), string(e.Outcome), tables.Filter(e.Detail)); err != nil {
		return fmt.Errorf("operator: audit %s of %q: %w", e.Action, e.Consumer, err)
	}
	return nil
}

// AuditOpts filters Audit. Zero fields do not filter.
type AuditOpts struct {
	Consumer  string
	RequestID int64
	// BeforeID pages: only entries with a smaller id.
	BeforeID int64
	// Limit bounds the result. Default 100.
	Limit int
}

// Audit returns the audit entries matching opts, newest first.
func (s *Store) Audit(ctx context.Context, db outbox.DB, opts *AuditOpts) ([]Entry, error) {
	if opts == nil {
		opts = &AuditOpts{}
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.Query(ctx, s.sql.Audit, tables.Filter(opts.Consumer), nullID(opts.RequestID), nullID(opts.BeforeID), limit)
	if err != nil {
		return nil, fmt.Errorf("operator: read audit: %w", err)
	}
	es, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Entry, error) {
		var (
			e                       Entry
			req, letter             *int64
			aggType, aggID, details *string
		)
		err := row.Scan(&e.ID, &e.At, &e.Actor, &e.Consumer, &e.Action, &req, &letter, &aggType, &aggID, &e.Outcome, &details)
		e.RequestID, e.LetterID, e.AggregateType, e.AggregateID, e.Detail = deref(req), deref(letter), deref(aggType), deref(aggID), deref(details)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("operator: read audit: %w", err)
	}
	return es, nil
}
