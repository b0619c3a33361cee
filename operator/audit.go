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
	// Outcome is one word: requested, applied, duplicate, discarded,
	// resolved, failed, skipped, done.
	Outcome string
	// Detail is the rest: the error, the filter, how many were drained.
	Detail string
}

// Record writes e (ID and At are set by the database). Given the action's
// own transaction, the row stands or falls with the action.
func (s *Store) Record(ctx context.Context, db outbox.DB, e *Entry) error {
	if _, err := db.Exec(ctx, s.sql.Record, e.Actor, e.Consumer, string(e.Action), nullID(e.RequestID), nullID(e.LetterID),
		tables.Filter(e.AggregateType), tables.Filter(e.AggregateID), e.Outcome, tables.Filter(e.Detail)); err != nil {
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
