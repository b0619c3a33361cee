package ordering

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
)

// GapPolicy says what to do with a record that arrives ahead of a gap.
type GapPolicy int

const (
	// GapPark stores the record in the parked table and applies it when the
	// gap fills. The partition keeps flowing. The default.
	GapPark GapPolicy = iota
	// GapFail refuses the record with a *GapError, so that the partition
	// stops and retries it until the gap fills.
	GapFail
	// GapIgnore applies the record, moves the position to it and reports
	// the gap. Records that arrive later with a lower sequence are applied
	// too (dedupe still catches real duplicates): ordering becomes advisory.
	GapIgnore
)

func (p GapPolicy) String() string {
	switch p {
	case GapPark:
		return "park"
	case GapFail:
		return "fail"
	case GapIgnore:
		return "ignore"
	}
	return fmt.Sprintf("GapPolicy(%d)", int(p))
}

// FirstSeenPolicy says how to treat an aggregate's first record when its
// sequence is above 1. See the package documentation for why the default
// is FirstSeenStrict.
type FirstSeenPolicy int

const (
	// FirstSeenStrict treats the record as a gap after sequence 0: it is
	// parked until the sequences before it are applied. The default.
	FirstSeenStrict FirstSeenPolicy = iota
	// FirstSeenBaseline applies the record and takes its sequence as the
	// aggregate's starting point; an earlier record arriving later is then
	// skipped as a duplicate.
	FirstSeenBaseline
)

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

// Aggregate names the entity a sequence belongs to.
type Aggregate struct {
	Type string
	ID   string
}

func (a Aggregate) String() string { return a.Type + "/" + a.ID }

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
	// GapPark.
	GapPolicy GapPolicy
	// FirstSeen applies to an aggregate's first record when its sequence is
	// above 1. Default FirstSeenStrict.
	FirstSeen FirstSeenPolicy
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
	if c.GapPolicy < GapPark || c.GapPolicy > GapIgnore {
		return nil, fmt.Errorf("ordering: unknown gap policy %d", int(c.GapPolicy))
	}
	if c.FirstSeen < FirstSeenStrict || c.FirstSeen > FirstSeenBaseline {
		return nil, fmt.Errorf("ordering: unknown first-seen policy %d", int(c.FirstSeen))
	}
	sql := tables.For(c.Schema)
	return &Tracker{consumer: consumer, cfg: c, pos: sql.Positions, parked: sql.Parked, holds: sql.DeadLetters.Holds}, nil
}

// Consumer returns the consumer name.
func (t *Tracker) Consumer() string { return t.consumer }

// Policy returns the gap policy.
func (t *Tracker) Policy() GapPolicy { return t.cfg.GapPolicy }

// advanceSQL returns the hot-path statement and its arguments for a record
// of agg at seq: a row (the parked count) means InOrder and the position
// moved; no row means the slow path must classify the record.
func (t *Tracker) advanceSQL(agg Aggregate, seq int64) (string, []any) {
	return t.pos.Advance, []any{t.consumer, agg.Type, agg.ID, seq, t.cfg.FirstSeen == FirstSeenBaseline}
}

// Check classifies seq for agg inside tx. On InOrder the position has
// already moved to seq in tx, so the caller must apply the record in tx or
// roll back. On Duplicate and Gap nothing changed; the position's row stays
// locked until tx ends. seq must be at least 1.
func (t *Tracker) Check(ctx context.Context, tx pgx.Tx, agg Aggregate, seq int64) (Check, error) {
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
			if seq == 1 || t.cfg.FirstSeen == FirstSeenBaseline {
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

func (t *Tracker) gap(ctx context.Context, tx pgx.Tx, agg Aggregate, last, seq int64, parked int) (Check, error) {
	var held bool
	if err := tx.QueryRow(ctx, t.holds, t.consumer, agg.Type, agg.ID, last, seq).Scan(&held); err != nil {
		return Check{}, fmt.Errorf("ordering: look for dead letters holding %s: %w", agg, err)
	}
	return Check{Verdict: Gap, Last: last, Parked: parked, Held: held}, nil
}

// Parked is a record waiting in the parked table.
type Parked struct {
	Aggregate Aggregate
	Seq       int64
	// Record is the record as it arrived: topic, partition, offset, key,
	// value, headers and timestamp.
	Record *kgo.Record
	// IdempotencyKey is the key the record was claimed under, if any.
	IdempotencyKey string
	ParkedAt       time.Time
}

// Park stores rec in tx to be applied after its predecessors, and reports
// whether it was stored: false means a record with this sequence is parked
// already (a duplicate).
func (t *Tracker) Park(ctx context.Context, tx pgx.Tx, agg Aggregate, seq int64, rec *kgo.Record, idempotencyKey string) (bool, error) {
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
func (t *Tracker) Drain(ctx context.Context, tx pgx.Tx, agg Aggregate, limit int, apply func(context.Context, *Parked) error) (int, error) {
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
func (t *Tracker) Lock(ctx context.Context, tx pgx.Tx, agg Aggregate) (bool, error) {
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
func (t *Tracker) Ready(ctx context.Context, db outbox.DB, limit int) ([]Aggregate, error) {
	rows, err := db.Query(ctx, t.parked.Ready, t.consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("ordering: list aggregates ready to drain: %w", err)
	}
	aggs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Aggregate, error) {
		var a Aggregate
		err := r.Scan(&a.Type, &a.ID)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("ordering: list aggregates ready to drain: %w", err)
	}
	return aggs, nil
}

func (t *Tracker) pop(ctx context.Context, tx pgx.Tx, agg Aggregate) (*Parked, error) {
	var (
		p        = Parked{Aggregate: agg, Record: &kgo.Record{}}
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
// first-seen policy puts an aggregate never seen: 0 under FirstSeenStrict
// (the sequences below seq are still owed, not skipped), seq-1 under
// FirstSeenBaseline.
func (t *Tracker) Hold(ctx context.Context, tx pgx.Tx, agg Aggregate, seq int64) error {
	start := int64(0)
	if t.cfg.FirstSeen == FirstSeenBaseline {
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
func (t *Tracker) SkipTo(ctx context.Context, tx pgx.Tx, agg Aggregate, seq int64) (bool, int, error) {
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

// OpenGap is an aggregate with records parked behind missing sequences.
type OpenGap struct {
	Aggregate Aggregate
	// Last is the last sequence applied; Expected = Last+1 is missing.
	Last, Expected int64
	// FirstParked is the lowest parked sequence; the gap is
	// Expected..FirstParked-1. It is 0, as Parked is, for an aggregate
	// with nothing parked whose dead letter lies beyond Expected: the gap
	// is then Expected..DeadLetterSeq-1.
	FirstParked int64
	// Parked is how many records wait.
	Parked int
	// Since is when the oldest of them was parked, or when the letter
	// first failed.
	Since time.Time
	// DeadLetterID is the lowest open dead letter inside the gap, at
	// DeadLetterSeq (Expected when the gap is that record alone); 0 when
	// the gap holds only missing records.
	DeadLetterID, DeadLetterSeq int64
}

// Gaps lists the consumer's open gaps, oldest first: every aggregate whose
// next sequence is missing while a later one waits, parked or dead-lettered.
func (t *Tracker) Gaps(ctx context.Context, db outbox.DB) ([]OpenGap, error) {
	rows, err := db.Query(ctx, t.parked.Gaps, t.consumer)
	if err != nil {
		return nil, fmt.Errorf("ordering: list gaps: %w", err)
	}
	var out []OpenGap
	for rows.Next() {
		var g OpenGap
		var dl []int64
		if err := rows.Scan(&g.Aggregate.Type, &g.Aggregate.ID, &g.Last, &g.Parked, &g.FirstParked, &g.Since, &dl); err != nil {
			rows.Close()
			return nil, fmt.Errorf("ordering: list gaps: %w", err)
		}
		g.Expected = g.Last + 1
		if len(dl) == 2 {
			g.DeadLetterID, g.DeadLetterSeq = dl[0], dl[1]
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ordering: list gaps: %w", err)
	}
	return out, nil
}

// Position returns agg's last applied sequence, 0 and false when it has
// none.
func (t *Tracker) Position(ctx context.Context, db outbox.DB, agg Aggregate) (int64, bool, error) {
	var last int64
	err := db.QueryRow(ctx, t.pos.Read,
		t.consumer, agg.Type, agg.ID).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("ordering: read position: %w", err)
	}
	return last, true, nil
}
