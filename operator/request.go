package operator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/tables"
)

// Action is what a request asks of a consumer.
type Action string

const (
	// Replay applies letters again through the handler, as
	// consumer.Processor.Replay does.
	Replay Action = "replay"
	// Discard gives up on letters for good and releases their successors,
	// as consumer.Processor.Discard does.
	Discard Action = "discard"
	// ResolveGap skips the missing sequences of one aggregate's gap, as
	// consumer.Processor.ResolveGap does.
	ResolveGap Action = "resolve_gap"
	// ReplayEvent is producer.DeadEvents.Replay of a producer's dead
	// event. It needs no handler, so a tool carries it out itself and
	// only records it ([Store.Record], with an empty Consumer); Submit
	// refuses it.
	ReplayEvent Action = "replay_event"
	// DiscardEvent is producer.DeadEvents.Discard, recorded as ReplayEvent
	// is.
	DiscardEvent Action = "discard_event"
)

// Status is where a request stands.
type Status string

const (
	// Pending is a request no consumer process has taken up yet.
	Pending Status = "pending"
	// Running is a request a consumer process carries out; Progress grows.
	Running Status = "running"
	// Done is a request carried out. Progress says what came of each
	// letter; some may have failed ([Progress.Failed]) without failing the
	// request.
	Done Status = "done"
	// Failed is a request that could not be carried out at all; Error
	// says why.
	Failed Status = "failed"
	// Cancelled is a request an operator cancelled ([Store.Cancel]) before
	// it ended. Progress counts what was done before the cancel; nothing
	// is done after it.
	Cancelled Status = "cancelled"
)

// The accepted range of [Request.Rate], in letters per second: 0 is no
// bound; any other rate must lie from MinRate (one letter every 1000 s)
// to MaxRate.
const (
	MinRate float64 = 0.001
	MaxRate float64 = 10000
)

// Request is an operator's request to a consumer.
type Request struct {
	ID       int64
	Consumer string
	Action   Action
	// LetterID names the one letter to replay or discard; zero for a bulk
	// request, whose letters Letters filters.
	LetterID int64
	// Letters filters the consumer's open letters for a bulk request
	// (Consumer, Status, AfterID and Limit are ignored). For ResolveGap,
	// its AggregateType and AggregateID name the aggregate.
	Letters deadletter.ListOpts
	// All must be set for a bulk request with an empty filter: it acts on
	// every open letter of the consumer. It is not stored.
	All bool
	// Rate bounds a bulk request in letters per second: 0 is no bound,
	// and any other value must lie from MinRate to MaxRate (Submit
	// refuses NaN, infinities, negatives and rates outside the range).
	Rate        float64
	RequestedBy string
	RequestedAt time.Time
	Status      Status
	// StartedAt is when a process first took it up, FinishedAt when it
	// ended; nil until then.
	StartedAt, FinishedAt *time.Time
	Progress              Progress
	// Error is why it failed, or the first letter's error for a request
	// that is done with [Progress.Failed] above zero.
	Error string
	// Claim counts the times a process took the request up (Claim). The
	// process that claimed it last writes under this number, and its
	// writes fail with ErrClaimLost once another process has claimed it
	// again.
	Claim int64
}

// Progress counts what a request did so far. Applied, Duplicates,
// Discarded and Drained are written in the transaction of the action they
// count ([Store.Count]), so they are exact whatever happens to the process
// carrying the request out; Matched, Failed and Skipped count the current
// (or last) process's run and are written as it goes (Report, Finish).
type Progress struct {
	// Matched counts the letters it set out to act on.
	Matched int64
	// Applied counts letters replayed, Duplicates those whose key was
	// claimed meanwhile (marked replayed, not applied again), Discarded
	// those discarded.
	Applied, Duplicates, Discarded int64
	// Failed counts letters whose action failed (they stay open), Skipped
	// those left because an earlier letter of their aggregate failed.
	Failed, Skipped int64
	// Drained counts the parked successors applied along the way.
	Drained int64
}

// Finished reports whether the request has ended: done, failed or
// cancelled.
func (r *Request) Finished() bool {
	return r.Status == Done || r.Status == Failed || r.Status == Cancelled
}

// Config tunes a Store. The zero value is valid.
type Config struct {
	// Schema holds the operator tables. Default outbox.DefaultSchema.
	Schema string
}

// Store reads and writes requests and audit rows. It is safe for
// concurrent use.
type Store struct {
	schema string
	sql    *tables.Operator
}

// New returns a store.
func New(cfg *Config) *Store {
	schema := outbox.DefaultSchema
	if cfg != nil && cfg.Schema != "" {
		schema = cfg.Schema
	}
	return &Store{schema: schema, sql: tables.OperatorFor(schema)}
}

// Channel is the LISTEN/NOTIFY channel on which Submit tells a schema's
// consumers that a request is waiting; the payload is the consumer's name.
func Channel(schema string) string {
	return tables.OperatorChannel(schema)
}

// Channel is the store's schema's Channel.
func (s *Store) Channel() string { return Channel(s.schema) }

func (r *Request) validate() error {
	if r.Consumer == "" {
		return fmt.Errorf("operator: request names no consumer: %w", ErrInvalid)
	}
	l := &r.Letters
	switch r.Action {
	case Replay, Discard:
		empty := l.Topic == "" && l.AggregateType == "" && l.AggregateID == "" && l.Reason == "" && l.Failure == "" &&
			l.FailedAfter.IsZero() && l.FailedBefore.IsZero()
		if r.LetterID == 0 && empty && !r.All {
			return fmt.Errorf("operator: %s names no letter and no filter; give a letter id, a filter, or set All to act on every open letter of %q: %w", r.Action, r.Consumer, ErrInvalid)
		}
	case ResolveGap:
		if l.AggregateID == "" {
			return fmt.Errorf("operator: resolve_gap names no aggregate; set Letters.AggregateType and Letters.AggregateID: %w", ErrInvalid)
		}
	default:
		return fmt.Errorf("operator: unknown action %q; want replay, discard or resolve_gap: %w", r.Action, ErrInvalid)
	}
	if err := l.Check(); err != nil {
		return fmt.Errorf("operator: %s: %w: %w", r.Action, err, ErrInvalid)
	}
	// Written so that NaN, which compares false with everything, fails.
	if r.Rate != 0 && !(r.Rate >= MinRate && r.Rate <= MaxRate) {
		return fmt.Errorf("operator: Rate %v letters per second is out of range; want 0 (no bound) or %g to %g: %w", r.Rate, MinRate, MaxRate, ErrInvalid)
	}
	return nil
}

// Submit stores r as pending, writes its audit row, tells the consumer's
// running processes, and returns its id. RequestedBy defaults to
// Actor(ctx). The fields a process fills in are ignored.
func (s *Store) Submit(ctx context.Context, db outbox.DB, r *Request) (int64, error) {
	if err := r.validate(); err != nil {
		return 0, err
	}
	by := r.RequestedBy
	if by == "" {
		by = Actor(ctx)
	}
	var id int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		l := &r.Letters
		if err := tx.QueryRow(ctx, s.sql.Submit, r.Consumer, string(r.Action), nullID(r.LetterID), tables.Filter(l.Topic),
			tables.Filter(l.AggregateType), tables.Filter(l.AggregateID), tables.Filter(string(l.Reason)), tables.Filter(l.Failure),
			nullTime(l.FailedAfter), nullTime(l.FailedBefore), nullRate(r.Rate), by).Scan(&id); err != nil {
			return err
		}
		e := &Entry{Actor: by, Consumer: r.Consumer, Action: r.Action, RequestID: id, LetterID: r.LetterID,
			AggregateType: l.AggregateType, AggregateID: l.AggregateID, Outcome: OutcomeRequested, Detail: r.describe()}
		if err := s.Record(ctx, tx, e); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.sql.Notify, s.Channel(), r.Consumer)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("operator: submit %s for %q: %w", r.Action, r.Consumer, err)
	}
	return id, nil
}

// describe says in a few words what r acts on, for its audit row.
func (r *Request) describe() string {
	if r.Action == ResolveGap {
		return "aggregate " + r.Letters.AggregateType + "/" + r.Letters.AggregateID
	}
	if r.LetterID != 0 {
		return fmt.Sprintf("letter %d", r.LetterID)
	}
	d := "letters"
	l := &r.Letters
	for _, f := range []struct{ name, v string }{{"topic", l.Topic}, {"aggregate_type", l.AggregateType}, {"aggregate_id", l.AggregateID},
		{"reason", string(l.Reason)}, {"failure", l.Failure}} {
		if f.v != "" {
			d += fmt.Sprintf(" %s=%q", f.name, f.v)
		}
	}
	if !l.FailedAfter.IsZero() {
		d += " failed_after=" + l.FailedAfter.UTC().Format(time.RFC3339)
	}
	if !l.FailedBefore.IsZero() {
		d += " failed_before=" + l.FailedBefore.UTC().Format(time.RFC3339)
	}
	if d == "letters" {
		d = "every open letter"
	}
	if r.Rate > 0 {
		d += fmt.Sprintf(" at %g/s", r.Rate)
	}
	return d
}

// Get returns request id, or an error wrapping outbox.ErrNotFound.
func (s *Store) Get(ctx context.Context, db outbox.DB, id int64) (*Request, error) {
	rs, err := s.query(ctx, db, s.sql.Get, id)
	if err != nil {
		return nil, fmt.Errorf("operator: get request %d: %w", id, err)
	}
	if len(rs) == 0 {
		return nil, fmt.Errorf("operator: request %d: %w", id, outbox.ErrNotFound)
	}
	return rs[0], nil
}

// ListOpts filters List. Zero fields do not filter.
type ListOpts struct {
	Consumer string
	Status   Status
	// BeforeID pages: only requests with a smaller id.
	BeforeID int64
	// Limit bounds the result. Default 50.
	Limit int
}

// List returns the requests matching opts, newest first.
func (s *Store) List(ctx context.Context, db outbox.DB, opts *ListOpts) ([]*Request, error) {
	if opts == nil {
		opts = &ListOpts{}
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = 50
	}
	rs, err := s.query(ctx, db, s.sql.List, tables.Filter(opts.Consumer), tables.Filter(string(opts.Status)), nullID(opts.BeforeID), limit)
	if err != nil {
		return nil, fmt.Errorf("operator: list requests: %w", err)
	}
	return rs, nil
}

// Wait reads request id every poll (default 200ms) until it has finished
// and returns it, or returns ctx's error with the request as last read.
func (s *Store) Wait(ctx context.Context, db outbox.DB, id int64, poll time.Duration) (*Request, error) {
	if poll <= 0 {
		poll = 200 * time.Millisecond
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	var last *Request
	for {
		r, err := s.Get(ctx, db, id)
		switch {
		case err != nil && last != nil && ctx.Err() != nil:
			return last, fmt.Errorf("operator: request %d is still %s: %w", id, last.Status, ctx.Err())
		case err != nil:
			return nil, err
		case r.Finished():
			return r, nil
		}
		last = r
		select {
		case <-ctx.Done():
			return r, fmt.Errorf("operator: request %d is still %s: %w", id, r.Status, ctx.Err())
		case <-t.C:
		}
	}
}

// Claim takes up consumer's oldest request that is pending, or running
// under a lease that ran out (its process died or stalled), marks it
// running under a lease of lease, raises its Claim, and returns it; nil
// when there is none. Two processes of one consumer never claim the same
// request. The process must Renew the lease well within lease for as long
// as it carries the request out (a heartbeat), write each action's count
// in the action's transaction (Count), and Finish it. All of these are
// fenced by r.Claim: once another process has claimed the request, they
// fail with ErrClaimLost and write nothing.
func (s *Store) Claim(ctx context.Context, db outbox.DB, consumer string, lease time.Duration) (*Request, error) {
	rs, err := s.query(ctx, db, s.sql.Claim, consumer, lease.Seconds())
	if err != nil {
		return nil, fmt.Errorf("operator: claim a request of %q: %w", consumer, err)
	}
	if len(rs) == 0 {
		return nil, nil
	}
	return rs[0], nil
}

// Renew extends the lease of r, which the caller claimed, to lease from
// now. It fails with ErrCancelled when r was cancelled, and with
// ErrClaimLost when another process claimed it meanwhile.
func (s *Store) Renew(ctx context.Context, db outbox.DB, r *Request, lease time.Duration) error {
	tag, err := db.Exec(ctx, s.sql.Renew, r.ID, r.Claim, lease.Seconds())
	if err != nil {
		return fmt.Errorf("operator: renew the lease of request %d: %w", r.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return s.fenced(ctx, db, r)
	}
	return nil
}

// Count adds delta's Applied, Duplicates, Discarded and Drained to r's
// progress (its other fields are ignored) and sets r.Progress's four to
// the sums. Call it in the transaction of the action it counts, so that
// the count stands or falls with the action: the counts stay exact
// whatever happens to the process. It fails with ErrCancelled or
// ErrClaimLost (see Renew), and then the caller must roll the action
// back.
func (s *Store) Count(ctx context.Context, db outbox.DB, r *Request, delta Progress) error {
	p := &r.Progress
	err := db.QueryRow(ctx, s.sql.Count, r.ID, r.Claim, delta.Applied, delta.Duplicates, delta.Discarded, delta.Drained).
		Scan(&p.Applied, &p.Duplicates, &p.Discarded, &p.Drained)
	if errors.Is(err, pgx.ErrNoRows) {
		return s.fenced(ctx, db, r)
	}
	if err != nil {
		return fmt.Errorf("operator: count the progress of request %d: %w", r.ID, err)
	}
	return nil
}

// Report writes r's Matched, Failed, Skipped and Error and renews its
// lease for lease from now; a lease of 0 gives the request up, to be
// claimed again at once. It fails as Renew does.
func (s *Store) Report(ctx context.Context, db outbox.DB, r *Request, lease time.Duration) error {
	p := &r.Progress
	tag, err := db.Exec(ctx, s.sql.Report, r.ID, r.Claim, lease.Seconds(), p.Matched, p.Failed, p.Skipped, tables.Filter(r.Error))
	if err != nil {
		return fmt.Errorf("operator: report request %d: %w", r.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return s.fenced(ctx, db, r)
	}
	return nil
}

// Finish writes r's Matched, Failed, Skipped and Error and ends it: Done,
// or Failed when failed is set; a request cancelled meanwhile stays
// Cancelled. r.Status and r.Progress are then as stored. It fails with
// ErrClaimLost when another process claimed r meanwhile.
func (s *Store) Finish(ctx context.Context, db outbox.DB, r *Request, failed bool) error {
	status := Done
	if failed {
		status = Failed
	}
	p := &r.Progress
	err := db.QueryRow(ctx, s.sql.Finish, r.ID, r.Claim, string(status), p.Matched, p.Failed, p.Skipped, tables.Filter(r.Error)).
		Scan(&r.Status, &p.Applied, &p.Duplicates, &p.Discarded, &p.Drained)
	if errors.Is(err, pgx.ErrNoRows) {
		return s.fenced(ctx, db, r)
	}
	if err != nil {
		return fmt.Errorf("operator: finish request %d: %w", r.ID, err)
	}
	return nil
}

// fenced is the error of a fenced write of r that touched no row: r was
// cancelled, or claimed by another process.
func (s *Store) fenced(ctx context.Context, db outbox.DB, r *Request) error {
	var (
		status Status
		claim  int64
	)
	if err := db.QueryRow(ctx, s.sql.Fence, r.ID).Scan(&status, &claim); err != nil {
		return fmt.Errorf("operator: request %d: read its claim: %w", r.ID, err)
	}
	if status == Cancelled {
		return fmt.Errorf("operator: request %d: %w", r.ID, ErrCancelled)
	}
	return fmt.Errorf("operator: request %d is claim %d now, not %d, and %s: %w", r.ID, claim, r.Claim, status, ErrClaimLost)
}

// Cancel ends request id, pending or running, as Cancelled and writes
// its audit row, with Actor(ctx) as who cancelled it; it returns the
// request as cancelled. A request that has ended already is left as it is
// and the error wraps ErrFinished; an unknown id gives an error wrapping
// outbox.ErrNotFound.
//
// After Cancel returns, no further action of the request takes effect:
// each action counts itself in its own transaction, under a check that
// the request is still running, so an action in flight either committed
// before the cancel (and is counted) or rolls back. The process carrying
// the request out stops before its next action.
func (s *Store) Cancel(ctx context.Context, db outbox.DB, id int64) (*Request, error) {
	var r *Request
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var was Status
		// FOR UPDATE waits for an action that has counted itself to
		// commit, so that it is counted before the cancel.
		if err := tx.QueryRow(ctx, s.sql.LockStatus, id).Scan(&was); errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("operator: request %d: %w", id, outbox.ErrNotFound)
		} else if err != nil {
			return err
		}
		if was != Pending && was != Running {
			return fmt.Errorf("operator: request %d is %s already; there is nothing to cancel: %w", id, was, ErrFinished)
		}
		rs, err := s.query(ctx, tx, s.sql.Cancel, id)
		if err != nil {
			return err
		}
		r = rs[0]
		return s.Record(ctx, tx, &Entry{Actor: Actor(ctx), Consumer: r.Consumer, Action: r.Action, RequestID: id, LetterID: r.LetterID,
			AggregateType: r.Letters.AggregateType, AggregateID: r.Letters.AggregateID, Outcome: OutcomeCancelled, Detail: "was " + string(was)})
	})
	if errors.Is(err, outbox.ErrNotFound) || errors.Is(err, ErrFinished) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("operator: cancel request %d: %w", id, err)
	}
	return r, nil
}

// query runs sql and reads the requests it returns.
func (s *Store) query(ctx context.Context, db outbox.DB, sql string, args ...any) ([]*Request, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Request, error) {
		var (
			r                                               Request
			letter                                          *int64
			topic, aggType, aggID, reason, failure, errText *string
			after, before                                   *time.Time
			rate                                            *float64
		)
		p := &r.Progress
		err := row.Scan(&r.ID, &r.Consumer, &r.Action, &letter, &topic, &aggType, &aggID, &reason, &failure, &after, &before,
			&rate, &r.RequestedBy, &r.RequestedAt, &r.Status, &r.StartedAt, &r.FinishedAt,
			&p.Matched, &p.Applied, &p.Duplicates, &p.Discarded, &p.Failed, &p.Skipped, &p.Drained, &errText, &r.Claim)
		if err != nil {
			return nil, err
		}
		r.LetterID, r.Rate, r.Error = deref(letter), deref(rate), deref(errText)
		r.Letters = deadletter.ListOpts{Topic: deref(topic), AggregateType: deref(aggType), AggregateID: deref(aggID),
			Reason: deadletter.Reason(deref(reason)), Failure: deref(failure), FailedAfter: deref(after), FailedBefore: deref(before)}
		return &r, nil
	})
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func nullID(id int64) *int64 {
	if id == 0 {
		return nil
	}
	return &id
}

func nullRate(r float64) *float64 {
	if r == 0 {
		return nil
	}
	return &r
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
