// Package letters reads and writes the dead_letters table for package
// consumer: Put in the record's failure transaction, the reads that
// consumer.Inspector offers, and Replay and Discard, which run the
// consumer's work under the letter's row lock. The vocabulary (Letter,
// ListOpts, Status, ...) is package deadletter's.
package letters

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/recordsql"
	"github.com/d419a114/outbox/internal/tables"
)

// Store reads and writes dead letters. It is safe for concurrent use.
type Store struct {
	sql tables.DeadLetters
}

// New returns the store of the dead_letters statements sql.
func New(sql tables.DeadLetters) *Store {
	return &Store{sql: sql}
}

// Put stores l (its ID, times and Status are ignored) in tx and returns its
// id. A letter is one record: the same record (same consumer, place in the
// topic, key, value and headers) failing again updates its open letter
// (attempts add up, the error is the newest), and a different record at the
// same place gets a letter of its own. A record whose letter was replayed or
// discarded already is not stored again: Put returns an error wrapping
// deadletter.ErrResolved and changes nothing. An empty Reason is
// deadletter.ReasonHandler; a Reason that is not one of
// deadletter.Reasons is refused.
func (s *Store) Put(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) (int64, error) {
	if l.Consumer == "" || l.Record == nil {
		return 0, errors.New("deadletter: put: letter needs a consumer and a record")
	}
	reason := l.Reason
	if reason == "" {
		reason = deadletter.ReasonHandler
	}
	if _, err := deadletter.ParseReason(string(reason)); err != nil {
		return 0, fmt.Errorf("deadletter: put: %w", err)
	}
	r := l.Record
	keys, values := recordsql.Split(r.Headers)
	var recTime *time.Time
	if !r.Timestamp.IsZero() {
		recTime = &r.Timestamp
	}
	var id int64
	err := tx.QueryRow(ctx, s.sql.Put,
		l.Consumer, recordsql.TextSafe(r.Topic), r.Partition, r.Offset, r.Key, r.Value, keys, values, recTime,
		nullString(l.IdempotencyKey), aggField(l.AggregateType, l.Seq), aggField(l.AggregateID, l.Seq), nullSeq(l.Seq),
		recordsql.TextSafe(l.Error), nullString(l.Stack), max(l.Attempts, 1), string(reason),
		recordsql.TextSafe(orDefault(l.Failure, string(reason)))).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("deadletter: put: the record's letter was replayed or discarded: %w", deadletter.ErrResolved)
	}
	if err != nil {
		return 0, fmt.Errorf("deadletter: put: %w", err)
	}
	return id, nil
}

// Get returns the letter with id, or an error wrapping outbox.ErrNotFound.
func (s *Store) Get(ctx context.Context, db outbox.DB, id int64) (*deadletter.Letter, error) {
	return s.get(ctx, db, s.sql.Get, id)
}

// Peek is Get for a page that shows a letter to a person: it reads at most
// 64 KiB of the record's key, value and stack and of each of its first 100
// headers, and 16,384 characters of the error, so that one hostile record
// cannot exhaust the process that shows it. Letter.ValueSize is the
// value's whole size. Replay and Discard read the letter whole.
func (s *Store) Peek(ctx context.Context, db outbox.DB, id int64) (*deadletter.Letter, error) {
	return s.get(ctx, db, s.sql.Peek, id)
}

// get runs sql, Get, Peek or GetForUpdate, for id.
func (s *Store) get(ctx context.Context, db outbox.DB, sql string, id int64) (*deadletter.Letter, error) {
	rows, err := db.Query(ctx, sql, id)
	if err != nil {
		return nil, fmt.Errorf("deadletter: get %d: %w", id, err)
	}
	ls, err := collect(rows)
	if err != nil {
		return nil, fmt.Errorf("deadletter: get %d: %w", id, err)
	}
	if len(ls) == 0 {
		return nil, fmt.Errorf("deadletter: letter %d: %w", id, outbox.ErrNotFound)
	}
	return ls[0], nil
}

// List returns letters matching opts, oldest (lowest id) first.
func (s *Store) List(ctx context.Context, db outbox.DB, opts *deadletter.ListOpts) ([]*deadletter.Letter, error) {
	if opts == nil {
		opts = &deadletter.ListOpts{}
	}
	if err := opts.Check(); err != nil {
		return nil, err
	}
	sql := s.sql.List
	if opts.Brief {
		sql = s.sql.ListBrief
	}
	rows, err := db.Query(ctx, sql, append(args(opts), opts.AfterID, limit(opts, 100))...)
	if err != nil {
		return nil, fmt.Errorf("deadletter: list: %w", err)
	}
	ls, err := collect(rows)
	if err != nil {
		return nil, fmt.Errorf("deadletter: list: %w", err)
	}
	return ls, nil
}

// args are the filter's statement arguments, $1 to $10, after
// pgx.QueryExecModeExec: the filter's optional parts ("$5 IS NULL OR
// aggregate_id = $5") let PostgreSQL use an index only in a plan made for
// the values given, and a cached statement soon gets a generic plan that
// scans (424 ms instead of 0.1 ms for one aggregate among a million open
// letters). An unnamed statement is planned for its values every time.
func args(o *deadletter.ListOpts) []any {
	return []any{pgx.QueryExecModeExec, tables.Filter(o.Consumer), tables.Filter(o.Topic), tables.Filter(string(o.Status)),
		tables.Filter(o.AggregateType), tables.Filter(o.AggregateID), tables.Filter(string(o.Reason)), tables.Filter(o.Failure),
		nullTime(o.FailedAfter), nullTime(o.FailedBefore), tables.Filter(o.IdempotencyKey)}
}

// limit is o.Limit, or def when it is not set.
func limit(o *deadletter.ListOpts, def int) int {
	if o.Limit <= 0 {
		return def
	}
	return o.Limit
}

// maxMatch bounds Match and Preview when ListOpts.Limit is not set.
const maxMatch = 1_000_000

// Match returns the letters matching opts (AfterID ignored) in the order
// an operator acting on many should take them: aggregate by aggregate,
// each aggregate's letters in sequence order, so that replaying one
// releases the records parked up to the next; the unsequenced letters
// last.
func (s *Store) Match(ctx context.Context, db outbox.DB, opts *deadletter.ListOpts) ([]deadletter.Ref, error) {
	if opts == nil {
		opts = &deadletter.ListOpts{}
	}
	if err := opts.Check(); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, s.sql.Match, append(args(opts), limit(opts, maxMatch))...)
	if err != nil {
		return nil, fmt.Errorf("deadletter: match: %w", err)
	}
	refs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadletter.Ref, error) {
		var ref deadletter.Ref
		err := r.Scan(&ref.ID, &ref.AggregateType, &ref.AggregateID, &ref.Seq)
		return ref, err
	})
	if err != nil {
		return nil, fmt.Errorf("deadletter: match: %w", err)
	}
	return refs, nil
}

// Preview counts what the letters matching opts (AfterID ignored) would
// touch if replayed or discarded, reading at most opts.Limit letters
// (default 1,000,000), for an operator's dry run.
func (s *Store) Preview(ctx context.Context, db outbox.DB, opts *deadletter.ListOpts) (deadletter.Preview, error) {
	if opts == nil {
		opts = &deadletter.ListOpts{}
	}
	if err := opts.Check(); err != nil {
		return deadletter.Preview{}, err
	}
	var p deadletter.Preview
	if err := db.QueryRow(ctx, s.sql.Preview, append(args(opts), limit(opts, maxMatch))...).Scan(&p.Letters, &p.Aggregates, &p.Parked); err != nil {
		return deadletter.Preview{}, fmt.Errorf("deadletter: preview: %w", err)
	}
	return p, nil
}

// Failures groups consumer's newest deadletter.FailureScan open letters by
// Letter.Failure, largest group first, at most limit groups (default 100).
// A group's Count counts its letters among those; Preview with a Failure
// filter counts them all.
func (s *Store) Failures(ctx context.Context, db outbox.DB, consumer string, limit int) ([]deadletter.Failure, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.Query(ctx, s.sql.Failures, consumer, limit, deadletter.FailureScan)
	if err != nil {
		return nil, fmt.Errorf("deadletter: failures: %w", err)
	}
	fs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadletter.Failure, error) {
		var f deadletter.Failure
		err := r.Scan(&f.Failure, &f.Reason, &f.Count, &f.Oldest, &f.Newest, &f.SampleID)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("deadletter: failures: %w", err)
	}
	return fs, nil
}

// ResolveFunc does the work of a replay or discard inside tx, with the
// letter's row locked.
type ResolveFunc func(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) error

// Replay runs fn for the open letter id in one transaction that also marks
// it replayed. If fn fails, nothing changes and its error is returned. A
// letter that is not open gives ErrResolved.
func (s *Store) Replay(ctx context.Context, db outbox.DB, id int64, fn ResolveFunc) error {
	return s.resolve(ctx, db, id, deadletter.StatusReplayed, fn)
}

// Discard marks the open letter id discarded, running fn (which may be nil)
// in the same transaction.
func (s *Store) Discard(ctx context.Context, db outbox.DB, id int64, fn ResolveFunc) error {
	return s.resolve(ctx, db, id, deadletter.StatusDiscarded, fn)
}

func (s *Store) resolve(ctx context.Context, db outbox.DB, id int64, to deadletter.Status, fn ResolveFunc) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("deadletter: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// FOR UPDATE: a second replay of the same letter waits here and then
	// finds it resolved.
	l, err := s.get(ctx, tx, s.sql.GetForUpdate, id)
	if err != nil {
		return err
	}
	if l.Status != deadletter.StatusDead {
		return fmt.Errorf("deadletter: letter %d is %s: %w", id, l.Status, deadletter.ErrResolved)
	}
	if fn != nil {
		if err := fn(ctx, tx, l); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, s.sql.SetStatus, id, string(to)); err != nil {
		return fmt.Errorf("deadletter: mark %d %s: %w", id, to, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("deadletter: commit: %w", err)
	}
	return nil
}

// row is a dead_letters row as tables.DeadLetterColumns reads it, scanned
// by column name.
type row struct {
	ID             int64                 `db:"id"`
	Consumer       string                `db:"consumer"`
	Topic          string                `db:"topic"`
	Partition      int32                 `db:"kafka_partition"`
	Offset         int64                 `db:"kafka_offset"`
	Key            []byte                `db:"record_key"`
	Value          []byte                `db:"value"`
	HeaderKeys     []string              `db:"header_keys"`
	HeaderValues   [][]byte              `db:"header_values"`
	RecordTime     *time.Time            `db:"record_time"`
	IdempotencyKey *string               `db:"idempotency_key"`
	AggregateType  *string               `db:"aggregate_type"`
	AggregateID    *string               `db:"aggregate_id"`
	Seq            *int64                `db:"aggregate_seq"`
	Error          string                `db:"error"`
	Stack          *string               `db:"stack"`
	Attempts       int                   `db:"attempts"`
	FirstFailedAt  time.Time             `db:"first_failed_at"`
	LastFailedAt   time.Time             `db:"last_failed_at"`
	Status         deadletter.Status     `db:"status"`
	ResolvedAt     *time.Time            `db:"resolved_at"`
	Reason         deadletter.Reason     `db:"reason"`
	Failure        string                `db:"failure"`
	ValueSize      int                   `db:"value_size"`
	History        []deadletter.Delivery `db:"history"`
}

func collect(rows pgx.Rows) ([]*deadletter.Letter, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*deadletter.Letter, error) {
		d, err := pgx.RowToStructByName[row](r)
		if err != nil {
			return nil, err
		}
		l := &deadletter.Letter{
			ID: d.ID, Consumer: d.Consumer,
			Record: &kgo.Record{Topic: d.Topic, Partition: d.Partition, Offset: d.Offset, Key: d.Key, Value: d.Value,
				Headers: recordsql.Join(d.HeaderKeys, d.HeaderValues)},
			IdempotencyKey: deref(d.IdempotencyKey), AggregateType: deref(d.AggregateType), AggregateID: deref(d.AggregateID),
			Error: d.Error, Stack: deref(d.Stack), Reason: d.Reason, Failure: d.Failure, Attempts: d.Attempts,
			FirstFailedAt: d.FirstFailedAt, LastFailedAt: d.LastFailedAt, Status: d.Status, ResolvedAt: d.ResolvedAt,
			ValueSize: d.ValueSize, History: d.History,
		}
		if d.RecordTime != nil {
			l.Record.Timestamp = *d.RecordTime
		}
		if d.Seq != nil {
			l.Seq = *d.Seq
		}
		return l, nil
	})
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	s = recordsql.TextSafe(s)
	return &s
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func nullSeq(seq int64) *int64 {
	if seq <= 0 {
		return nil
	}
	return &seq
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// aggField keeps an empty aggregate type or id of a sequenced record as ”
// (not NULL), so that ordering's lookups by aggregate find it.
func aggField(s string, seq int64) *string {
	if seq > 0 {
		s = recordsql.TextSafe(s)
		return &s
	}
	return nullString(s)
}
