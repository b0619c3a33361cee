package operator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	// only records it (Store.Record, with an empty Consumer); Submit
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
	// letter; some may have failed (Progress.Failed) without failing the
	// request.
	Done Status = "done"
	// Failed is a request that could not be carried out at all; Error
	// says why.
	Failed Status = "failed"
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
	// Rate bounds a bulk request in letters per second; zero is no bound.
	Rate        float64
	RequestedBy string
	RequestedAt time.Time
	Status      Status
	// StartedAt is when a process first took it up, FinishedAt when it
	// ended; nil until then.
	StartedAt, FinishedAt *time.Time
	Progress              Progress
	// Error is why it failed, or the first letter's error for a request
	// that is done with Progress.Failed above zero.
	Error string
}

// Progress counts what a request did so far.
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

// Finished reports whether the request has ended, done or failed.
func (r *Request) Finished() bool { return r.Status == Done || r.Status == Failed }

// Config tunes a Store. The zero value is valid.
type Config struct {
	// Schema holds the operator tables. Default outbox.DefaultSchema.
	Schema string
}

// Store reads and writes requests and audit rows. It is safe for
// concurrent use.
type Store struct {
	schema string
	sql    statements
}

// New returns a store.
func New(cfg *Config) *Store {
	schema := outbox.DefaultSchema
	if cfg != nil && cfg.Schema != "" {
		schema = cfg.Schema
	}
	return &Store{schema: schema, sql: statementsFor(schema)}
}

// Channel is the LISTEN/NOTIFY channel on which Submit tells a schema's
// consumers that a request is waiting; the payload is the consumer's name.
func Channel(schema string) string {
	sum := sha256.Sum256([]byte(schema))
	return "outbox_op_" + hex.EncodeToString(sum[:])[:16]
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
	if r.Rate < 0 {
		return fmt.Errorf("operator: negative rate %v: %w", r.Rate, ErrInvalid)
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
		if err := tx.QueryRow(ctx, s.sql.submit, r.Consumer, string(r.Action), nullID(r.LetterID), tables.Filter(l.Topic),
			tables.Filter(l.AggregateType), tables.Filter(l.AggregateID), tables.Filter(l.Reason), tables.Filter(l.Failure),
			nullTime(l.FailedAfter), nullTime(l.FailedBefore), nullRate(r.Rate), by).Scan(&id); err != nil {
			return err
		}
		e := &Entry{Actor: by, Consumer: r.Consumer, Action: r.Action, RequestID: id, LetterID: r.LetterID,
			AggregateType: l.AggregateType, AggregateID: l.AggregateID, Outcome: "requested", Detail: r.describe()}
		if err := s.Record(ctx, tx, e); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, s.Channel(), r.Consumer)
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
		{"reason", l.Reason}, {"failure", l.Failure}} {
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

// Get returns request id, or an error wrapping ErrNotFound.
func (s *Store) Get(ctx context.Context, db outbox.DB, id int64) (*Request, error) {
	rs, err := s.query(ctx, db, s.sql.get, id)
	if err != nil {
		return nil, fmt.Errorf("operator: get request %d: %w", id, err)
	}
	if len(rs) == 0 {
		return nil, fmt.Errorf("operator: request %d: %w", id, ErrNotFound)
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
	rs, err := s.query(ctx, db, s.sql.list, tables.Filter(opts.Consumer), tables.Filter(string(opts.Status)), nullID(opts.BeforeID), limit)
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
// under a lease that ran out (its process died), marks it running under a
// lease of lease, and returns it; nil when there is none. Two processes of
// one consumer never claim the same request. The process must Report
// within lease, and Finish it.
func (s *Store) Claim(ctx context.Context, db outbox.DB, consumer string, lease time.Duration) (*Request, error) {
	rs, err := s.query(ctx, db, s.sql.claim, consumer, lease.Seconds())
	if err != nil {
		return nil, fmt.Errorf("operator: claim a request of %q: %w", consumer, err)
	}
	if len(rs) == 0 {
		return nil, nil
	}
	return rs[0], nil
}

// Report writes r's progress and error and renews its lease for lease.
func (s *Store) Report(ctx context.Context, db outbox.DB, r *Request, lease time.Duration) error {
	p := &r.Progress
	if _, err := db.Exec(ctx, s.sql.report, r.ID, lease.Seconds(), p.Matched, p.Applied, p.Duplicates, p.Discarded,
		p.Failed, p.Skipped, p.Drained, tables.Filter(r.Error)); err != nil {
		return fmt.Errorf("operator: report request %d: %w", r.ID, err)
	}
	return nil
}

// Finish writes r's progress and error and ends it: Done, or Failed when
// failed is set.
func (s *Store) Finish(ctx context.Context, db outbox.DB, r *Request, failed bool) error {
	r.Status = Done
	if failed {
		r.Status = Failed
	}
	p := &r.Progress
	if _, err := db.Exec(ctx, s.sql.finish, r.ID, string(r.Status), p.Matched, p.Applied, p.Duplicates, p.Discarded,
		p.Failed, p.Skipped, p.Drained, tables.Filter(r.Error)); err != nil {
		return fmt.Errorf("operator: finish request %d: %w", r.ID, err)
	}
	return nil
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
			&p.Matched, &p.Applied, &p.Duplicates, &p.Discarded, &p.Failed, &p.Skipped, &p.Drained, &errText)
		if err != nil {
			return nil, err
		}
		r.LetterID, r.Rate, r.Error = deref(letter), deref(rate), deref(errText)
		r.Letters = deadletter.ListOpts{Topic: deref(topic), AggregateType: deref(aggType), AggregateID: deref(aggID),
			Reason: deref(reason), Failure: deref(failure), FailedAfter: deref(after), FailedBefore: deref(before)}
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
