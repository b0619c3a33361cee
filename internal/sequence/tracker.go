// Package sequence is the transaction protocol of per-aggregate ordering
// that consumer.Processor drives: Check a record's sequence against its
// aggregate's position, Park it ahead of a gap, Drain the parked records
// that are next in line, Hold an aggregate behind a dead letter, SkipTo
// past a gap. Each step runs in the caller's transaction, and the
// guarantees rest on the Processor running them together with the claim
// of the record's key and the dead-lettering of records that fail: parking
// a record whose key was not claimed, or draining outside the transaction
// that moved the position, can apply an event twice or out of order. The
// operators' reads of the same tables are in reads.go, for
// consumer.Inspector.
package sequence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/recordsql"
	"github.com/d419a114/outbox/internal/tables"
	"github.com/d419a114/outbox/ordering"
)

// ErrStopDrain is returned by a Drain callback to stop draining without an
// error and without moving the position past the record it was given. The
// callback must have disposed of the record (dead-lettered it, typically),
// since Drain already took it out of the parked table.
var ErrStopDrain = errors.New("ordering: stop draining")

// Verdict is how a record's sequence relates to its aggregate's position.
type Verdict int

const (
	// InOrder means the record is the next one; the position now points at it.
	InOrder Verdict = iota + 1
	// Duplicate means the sequence was applied before.
	Duplicate
	// Gap means predecessors are missing.
	Gap
)

func (v Verdict) String() string {
	switch v {
	case InOrder:
		return "in_order"
	case Duplicate:
		return "duplicate"
	case Gap:
		return "gap"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Check is the outcome of Tracker.Check.
type Check struct {
	Verdict Verdict
	// Last is the position before the check: the last sequence applied, 0
	// when none. For InOrder it is Seq-1.
	Last int64
	// Parked is how many records of the aggregate wait in the parked table.
	Parked int
	// Held is set on a Gap when an open dead letter of the aggregate lies
	// inside the gap: the record must be parked whatever the policy.
	Held bool
}

// Config tunes a Tracker. The zero value is valid.
type Config struct {
	// Schema holds the tables. Default outbox.DefaultSchema.
	Schema string
	// GapPolicy applies to records that arrive ahead of a gap. Default
	// ordering.GapPark.
	GapPolicy ordering.GapPolicy
	// FirstSeen applies to an aggregate's first record when its sequence is
	// above 1. Default ordering.FirstSeenStrict.
	FirstSeen ordering.FirstSeenPolicy
}

// Tracker keeps the positions of one consumer. It is safe for concurrent
// use; the row lock on an aggregate's position orders concurrent
// transactions on that aggregate.
type Tracker struct {
	consumer string
	cfg      Config
	pos      tables.Positions
	parked   tables.Parked
	holds    string
}

// New returns the tracker of the named consumer.
func New(consumer string, cfg *Config) (*Tracker, error) {
	if consumer == "" {
		return nil, errors.New("ordering: empty consumer name; name the consumer, for example after its service")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	c := *cfg
	if c.Schema == "" {
		c.Schema = outbox.DefaultSchema
	}
	if err := tables.CheckSchema(c.Schema); err != nil {
		return nil, fmt.Errorf("ordering: %w", err)
	}
	if c.GapPolicy < ordering.GapPark || c.GapPolicy > ordering.GapIgnore {
		return nil, fmt.Errorf("ordering: unknown gap policy %d", int(c.GapPolicy))
	}
	if c.FirstSeen < ordering.FirstSeenStrict || c.FirstSeen > ordering.FirstSeenBaseline {
		return nil, fmt.Errorf("ordering: unknown first-seen policy %d", int(c.FirstSeen))
	}
	sql := tables.For(c.Schema)
	return &Tracker{consumer: consumer, cfg: c, pos: sql.Positions, parked: sql.Parked, holds: sql.DeadLetters.Holds}, nil
}

// Consumer returns the consumer name.
func (t *Tracker) Consumer() string { return t.consumer }

// Policy returns the gap policy.
func (t *Tracker) Policy() ordering.GapPolicy { return t.cfg.GapPolicy }

// advanceSQL returns the hot-path statement and its arguments for a record
// of agg at seq: a row (the parked count) means InOrder and the position
// moved; no row means the slow path must classify the record.
func (t *Tracker) advanceSQL(agg ordering.Aggregate, seq int64) (string, []any) {
	return t.pos.Advance, []any{t.consumer, agg.Type, agg.ID, seq, t.cfg.FirstSeen == ordering.FirstSeenBaseline}
}

// Check classifies seq for agg inside tx. On InOrder the position has
// already moved to seq in tx, so the caller must apply the record in tx or
// roll back. On Duplicate and Gap nothing changed; the position's row stays
// locked until tx ends. seq must be at least 1.
func (t *Tracker) Check(ctx context.Context, tx pgx.Tx, agg ordering.Aggregate, seq int64) (Check, error) {
	if seq < 1 {
		return Check{}, fmt.Errorf("ordering: sequence %d of %s is below 1", seq, agg)
	}
	created := false
	for range 3 {
		sql, args := t.advanceSQL(agg, seq)
		var parked int
		err := tx.QueryRow(ctx, sql, args...).Scan(&parked)
		if err == nil {
			return Check{Verdict: InOrder, Last: seq - 1, Parked: parked}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Check{}, fmt.Errorf("ordering: advance position: %w", err)
		}
		var last int64
		err = tx.QueryRow(ctx, t.pos.Lock, t.consumer, agg.Type, agg.ID).Scan(&last, &parked)
		if errors.Is(err, pgx.ErrNoRows) {
			if seq == 1 || t.cfg.FirstSeen == ordering.FirstSeenBaseline {
				continue // a concurrent transaction rolled back its insert; retry
			}
			if created {
				return Check{}, fmt.Errorf("ordering: position of %s vanished after it was created", agg)
			}
			// Never seen and not accepted as a baseline: strict. But
			// another transaction may be creating the position right
			// now (a batch moving it from nothing to any sequence), and
			// its row is invisible until it commits. Creating the row at
			// 0 waits for it; the verdict is then taken again on what it
			// committed, or on the row created here.
			if _, err := tx.Exec(ctx, t.pos.Hold, t.consumer, agg.Type, agg.ID, 0); err != nil {
				return Check{}, fmt.Errorf("ordering: create position: %w", err)
			}
			created = true
			continue
		}
		if err != nil {
			return Check{}, fmt.Errorf("ordering: lock position: %w", err)
		}
		switch {
		case seq <= last:
			return Check{Verdict: Duplicate, Last: last, Parked: parked}, nil
		case seq == last+1:
			continue // moved under us between the two statements; retry
		default:
			return t.gap(ctx, tx, agg, last, seq, parked)
		}
	}
	return Check{}, fmt.Errorf("ordering: position of %s keeps moving; retry", agg)
}

func (t *Tracker) gap(ctx context.Context, tx pgx.Tx, agg ordering.Aggregate, last, seq int64, parked int) (Check, error) {
	var held bool
	if err := tx.QueryRow(ctx, t.holds, t.consumer, agg.Type, agg.ID, last, seq).Scan(&held); err != nil {
		return Check{}, fmt.Errorf("ordering: look for dead letters holding %s: %w", agg, err)
	}
	return Check{Verdict: Gap, Last: last, Parked: parked, Held: held}, nil
}

// Park stores rec in tx to be applied after its predecessors, and reports
// whether it was stored: false means a record with this sequence is parked
// already (a duplicate).
func (t *Tracker) Park(ctx context.Context, tx pgx.Tx, agg ordering.Aggregate, seq int64, rec *kgo.Record, idempotencyKey string) (bool, error) {
	keys, values := recordsql.Split(rec.Headers)
	var ts *time.Time
	if !rec.Timestamp.IsZero() {
		ts = &rec.Timestamp
	}
	var ik *string
	if idempotencyKey != "" {
		ik = &idempotencyKey
	}
	tag, err := tx.Exec(ctx, t.parked.Park, t.consumer, agg.Type, agg.ID, seq, rec.Topic, rec.Partition, rec.Offset,
		rec.Key, rec.Value, keys, values, ts, ik)
	if err != nil {
		return false, fmt.Errorf("ordering: park record: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	if _, err := tx.Exec(ctx, t.pos.BumpParked, t.consumer, agg.Type, agg.ID); err != nil {
		return false, fmt.Errorf("ordering: count parked record: %w", err)
	}
	return true, nil
}

// Drain applies agg's parked records that are next in line, in sequence
// order, inside tx: it takes each out of the parked table, calls apply, and
// moves the position to it. It stops at the first missing sequence, after
// limit records when limit is above 0, when apply returns ErrStopDrain, or
// at apply's first other error (which it returns; the caller should roll
// back). It returns how many it applied; a caller that bounds its
// transactions drains again, in a new one, while that count reaches limit.
func (t *Tracker) Drain(ctx context.Context, tx pgx.Tx, agg ordering.Aggregate, limit int, apply func(context.Context, *ordering.Parked) error) (int, error) {
	n := 0
	for limit <= 0 || n < limit {
		p, err := t.pop(ctx, tx, agg)
		if err != nil || p == nil {
			return n, err
		}
		if err := apply(ctx, p); err != nil {
			if errors.Is(err, ErrStopDrain) {
				return n, nil
			}
			return n, err
		}
		if _, err := tx.Exec(ctx, t.pos.SetLast, t.consumer, agg.Type, agg.ID, p.Seq); err != nil {
			return n, fmt.Errorf("ordering: advance position: %w", err)
		}
		n++
	}
	return n, nil
}

// Lock takes the row lock on agg's position until tx ends, so that a drain
// in tx does not race another transaction on the aggregate. It reports
// whether the aggregate has a position.
func (t *Tracker) Lock(ctx context.Context, tx pgx.Tx, agg ordering.Aggregate) (bool, error) {
	var (
		last   int64
		parked int
	)
	err := tx.QueryRow(ctx, t.pos.Lock, t.consumer, agg.Type, agg.ID).Scan(&last, &parked)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ordering: lock position of %s: %w", agg, err)
	}
	return true, nil
}

// Ready lists up to limit aggregates whose next parked record is in line
// (its sequence follows the position) although nothing is draining it: a
// drain bounded by its limit, or one whose process stopped between two
// transactions, left it there. Drain each, under Lock, oldest first.
func (t *Tracker) Ready(ctx context.Context, db outbox.DB, limit int) ([]ordering.Aggregate, error) {
	rows, err := db.Query(ctx, t.parked.Ready, t.consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("ordering: list aggregates ready to drain: %w", err)
	}
	aggs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ordering.Aggregate, error) {
		var a ordering.Aggregate
		err := r.Scan(&a.Type, &a.ID)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("ordering: list aggregates ready to drain: %w", err)
	}
	return aggs, nil
}

func (t *Tracker) pop(ctx context.Context, tx pgx.Tx, agg ordering.Aggregate) (*ordering.Parked, error) {
	var (
		p        = ordering.Parked{Aggregate: agg, Record: &kgo.Record{}}
		keys     []string
		values   [][]byte
		recTime  *time.Time
		idemKey  *string
		parkedAt time.Time
	)
	err := tx.QueryRow(ctx, t.parked.Pop, t.consumer, agg.Type, agg.ID).Scan(&p.Seq, &p.Record.Topic, &p.Record.Partition,
		&p.Record.Offset, &p.Record.Key, &p.Record.Value, &keys, &values, &recTime, &idemKey, &parkedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ordering: take parked record: %w", err)
	}
	p.Record.Headers = recordsql.Join(keys, values)
	if recTime != nil {
		p.Record.Timestamp = *recTime
	}
	if idemKey != nil {
		p.IdempotencyKey = *idemKey
	}
	p.ParkedAt = parkedAt
	return &p, nil
}

// Hold makes sure agg has a position, so that records after seq see a gap
// and are parked until seq is resolved. Call it when seq is dead-lettered,
// in the dead letter's transaction. A position it creates is where the
// first-seen policy puts an aggregate never seen: 0 under ordering.FirstSeenStrict
// (the sequences below seq are still owed, not skipped), seq-1 under
// ordering.FirstSeenBaseline.
func (t *Tracker) Hold(ctx context.Context, tx pgx.Tx, agg ordering.Aggregate, seq int64) error {
	start := int64(0)
	if t.cfg.FirstSeen == ordering.FirstSeenBaseline {
		start = seq - 1
	}
	if _, err := tx.Exec(ctx, t.pos.Hold, t.consumer, agg.Type, agg.ID, start); err != nil {
		return fmt.Errorf("ordering: hold %s: %w", agg, err)
	}
	return nil
}

// SkipTo gives up on agg's sequences up to and including seq: the position
// moves to seq if it is below it. It reports whether it moved and how many
// records are parked. Call Drain next, in the same transaction, to apply the
// records that are now in line.
func (t *Tracker) SkipTo(ctx context.Context, tx pgx.Tx, agg ordering.Aggregate, seq int64) (bool, int, error) {
	var parked int
	err := tx.QueryRow(ctx, t.pos.SkipTo, t.consumer, agg.Type, agg.ID, seq).Scan(&parked)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("ordering: skip %s to %d: %w", agg, seq, err)
	}
	return true, parked, nil
}

// Position returns agg's last applied sequence, 0 and false when it has
// none.
func (t *Tracker) Position(ctx context.Context, db outbox.DB, agg ordering.Aggregate) (int64, bool, error) {
	return position(ctx, db, t.pos.Read, t.consumer, agg)
}

// Gap returns agg's open gap, nil when it has none: the gap of its parked
// records, or, with nothing parked, the one before its lowest open dead
// letter when that lies beyond the next sequence.
func (t *Tracker) Gap(ctx context.Context, db outbox.DB, agg ordering.Aggregate) (*ordering.OpenGap, error) {
	var (
		g  = ordering.OpenGap{Aggregate: agg}
		dl []int64
	)
	err := db.QueryRow(ctx, t.parked.Gap, t.consumer, agg.Type, agg.ID).Scan(&g.Last, &g.Parked, &g.FirstParked, &g.Since, &dl)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ordering: read the gap of %s: %w", agg, err)
	}
	g.Expected = g.Last + 1
	if len(dl) == 2 {
		g.DeadLetterID, g.DeadLetterSeq = dl[0], dl[1]
	}
	return &g, nil
}
