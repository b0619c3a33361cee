package move

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
	"github.com/d419a114/outbox/shard"
)

// Endpoint is one side of a move: a shard and a connection to it. The
// shard's Name is what the other side records and what a refused write
// names; its Schema holds the outbox tables (default outbox.DefaultSchema).
type Endpoint struct {
	Shard shard.Shard
	// DB reaches Shard's database, typically a *pgxpool.Pool.
	DB outbox.DB
}

// Aggregate names one aggregate to move.
type Aggregate struct {
	Type, ID string
}

// Config tunes Run and Resume. The zero value is valid.
type Config struct {
	// ID names the move. Run with the ID of a move under way continues
	// it. Default: a new random id.
	ID string
	// PollInterval is how often the drain looks whether the source
	// delivered everything. Default 100ms.
	PollInterval time.Duration
	// Logger receives a line per step. Default slog.Default().
	Logger *slog.Logger
	// AllowNew lets a move take aggregates that the source never
	// numbered (no event written there and none carried in by a move),
	// which then start at sequence 1 on the target. Without it such an
	// aggregate is refused with a *ConflictError before anything
	// changes: a move knows only its two shards, and an aggregate with
	// no events on the source may have them on a third shard, whose
	// numbers the target would then reuse. Set it only for aggregates
	// that have no events anywhere yet.
	AllowNew bool

	// stopAfter ends Run or Resume with errStopped right after step
	// stopAfter (1 prepare, 2 close, 3 open, 4 drain, 5 release), as a
	// crash there would: for the tests.
	stopAfter int
	// pause, when set, is called before step 1 (with 0), after each step
	// (with its number) and after a rollback ended the reservation on the
	// target (with stepTargetRolledBack): the tests block a mover there
	// to make it collide with another on purpose.
	pause func(step int)
}

// stepTargetRolledBack is the step pause is called with once rollBack
// ended the reservation on the target, before it reopens the source.
const stepTargetRolledBack = -1

// ErrBlocked is wrapped by the *BlockedError of a move that cannot drain.
var ErrBlocked = errors.New("move: blocked by a dead event on the source")

// ErrUnknownMove is returned by Resume and Get for an id that neither
// shard has a record of.
var ErrUnknownMove = errors.New("move: no such move on either shard")

// ErrRolledBack is returned by Run for a move that Resume rolled back.
var ErrRolledBack = errors.New("move: the move was rolled back")

// DeadEvent is an event dead on the source that blocks a move.
type DeadEvent struct {
	ID                         int64
	AggregateType, AggregateID string
	Seq                        int64
	LastError                  string
}

// BlockedError says which dead events on the source keep a move from
// draining. The move stays under way (its target's events held): replay
// or discard the events (outbox dead-events commands or the operator
// package), then call Resume. It wraps ErrBlocked.
type BlockedError struct {
	MoveID string
	Shard  string
	Dead   []DeadEvent
}

func (e *BlockedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "move %s: %d dead event(s) on shard %q keep it from draining; replay or discard them, then call move.Resume:",
		e.MoveID, len(e.Dead), e.Shard)
	for i, d := range e.Dead {
		if i == 5 {
			fmt.Fprintf(&b, " and %d more", len(e.Dead)-5)
			break
		}
		fmt.Fprintf(&b, " event %d (%s/%s seq %d: %s)", d.ID, d.AggregateType, d.AggregateID, d.Seq, d.LastError)
	}
	return b.String()
}

// Unwrap returns ErrBlocked.
func (e *BlockedError) Unwrap() error { return ErrBlocked }

// ConflictError is a move that cannot start or open because of the
// aggregate's state on one side: never numbered (without
// Config.AllowNew), already moved or arriving on the source,
// reserved by another move or numbered beyond the source on the target,
// or a move id already used for another target. One from the reserve or
// the close leaves nothing of the move under way: Run rolls back its
// reservation on the target before it returns.
type ConflictError struct {
	Shard     string
	Aggregate Aggregate
	Reason    string
	// Move is the other move that holds the aggregate, when one does.
	Move string
}

func (e *ConflictError) Error() string {
	s := fmt.Sprintf("move: aggregate %s/%s on shard %q: %s", e.Aggregate.Type, e.Aggregate.ID, e.Shard, e.Reason)
	if e.Move != "" {
		s += fmt.Sprintf(" (move %s; move.Get shows where it got to, and move.Resume finishes it if it was interrupted)", e.Move)
	}
	return s
}

// errStopped is what Run returns when Config.stopAfter cut it short.
var errStopped = errors.New("move: stopped for a test")

type mover struct {
	id       string
	from, to Endpoint
	fromSQL  tables.Moves
	toSQL    tables.Moves
	poll     time.Duration
	log      *slog.Logger
	stop     int
	pause    func(step int)
	allowNew bool
}

func newMover(from, to Endpoint, cfg *Config) (*mover, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if from.DB == nil || to.DB == nil {
		return nil, errors.New("move: both endpoints need a DB")
	}
	if from.Shard.Name == "" || to.Shard.Name == "" {
		return nil, errors.New("move: both endpoints need a shard name: it is what a refused write names")
	}
	if from.Shard.Name == to.Shard.Name {
		return nil, fmt.Errorf("move: source and target are both shard %q; name two different shards", from.Shard.Name)
	}
	m := &mover{id: cfg.ID, from: from, to: to, poll: cfg.PollInterval, log: cfg.Logger, stop: cfg.stopAfter, pause: cfg.pause, allowNew: cfg.AllowNew}
	if m.poll <= 0 {
		m.poll = 100 * time.Millisecond
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	var err error
	if m.fromSQL, err = statementsFor(from.Shard.Schema); err != nil {
		return nil, err
	}
	if m.toSQL, err = statementsFor(to.Shard.Schema); err != nil {
		return nil, err
	}
	return m, nil
}

// Run moves aggregates from one shard to the other and returns the move's
// id once the target publishes them; see the package doc for the steps.
// It blocks while the source drains. When ctx ends, or a step fails, the
// move stays where it got to and Run returns the id with the error: call
// Run again with Config.ID set to it, or Resume, to finish it. A dead
// event on the source returns a *BlockedError.
func Run(ctx context.Context, from, to Endpoint, aggregates []Aggregate, cfg *Config) (string, error) {
	m, err := newMover(from, to, cfg)
	if err != nil {
		return "", err
	}
	if m.id == "" {
		m.id = newID()
	}
	if len(aggregates) == 0 {
		return m.id, errors.New("move: no aggregates given")
	}
	aggs := slices.Clone(aggregates)
	slices.SortFunc(aggs, compare)
	aggs = slices.Compact(aggs)
	return m.id, m.run(ctx, aggs)
}

// Resume finishes move id after a crash or a cancelled Run: if the
// target was opened it drains and releases; if not, it rolls the move
// back, and the aggregates stay on the source and take writes there
// again (the target refuses them, naming the source). It returns
// ErrUnknownMove when neither shard has a record of id. Two Resumes of
// one move, or a Resume racing a Run of it, end the move once: both
// finish it, or both see it rolled back (the Run with ErrRolledBack);
// a Resume before the Run recorded anything returns ErrUnknownMove.
func Resume(ctx context.Context, id string, from, to Endpoint, cfg *Config) error {
	m, err := newMover(from, to, cfg)
	if err != nil {
		return err
	}
	m.id = id
	in, err := m.records(ctx, to.DB, m.toSQL, "in")
	if err != nil {
		return err
	}
	if len(in) == 0 {
		out, err := m.records(ctx, from.DB, m.fromSQL, "out")
		if err != nil {
			return err
		}
		if len(out) == 0 {
			return fmt.Errorf("%w: %s on shards %q and %q", ErrUnknownMove, id, from.Shard.Name, to.Shard.Name)
		}
	}
	if len(in) == 0 || in[0].state == "prepared" || in[0].state == "rolled_back" {
		return m.rollBack(ctx)
	}
	aggs := make([]Aggregate, len(in))
	for i, r := range in {
		aggs[i] = r.agg
	}
	return m.run(ctx, aggs)
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// after is called once step is done (0: before the first): it pauses
// there and stops there when the tests asked for it.
func (m *mover) after(step int) error {
	if m.pause != nil {
		m.pause(step)
	}
	if step > 0 && m.stop == step {
		return errStopped
	}
	return nil
}

func (m *mover) run(ctx context.Context, aggs []Aggregate) error {
	if err := m.checkDispatch(ctx); err != nil {
		return err
	}
	if err := m.after(0); err != nil {
		return err
	}
	if err := m.prepare(ctx, aggs); err != nil {
		return err
	}
	if err := m.after(1); err != nil {
		return err
	}
	lasts, err := m.close(ctx, aggs)
	if err != nil {
		return m.undo(ctx, err)
	}
	if err := m.after(2); err != nil {
		return err
	}
	if err := m.open(ctx, lasts); err != nil {
		if errors.Is(err, ErrRolledBack) {
			// Resume rolled the target back while this Run closed the
			// source: reopen it too.
			return errors.Join(err, m.rollBack(ctx))
		}
		return err
	}
	if err := m.after(3); err != nil {
		return err
	}
	start := time.Now()
	if err := m.drain(ctx); err != nil {
		return err
	}
	if err := m.after(4); err != nil {
		return err
	}
	if err := m.release(ctx); err != nil {
		return err
	}
	if err := m.after(5); err != nil {
		return err
	}
	if err := m.finish(ctx); err != nil {
		return err
	}
	m.log.InfoContext(ctx, "move: done", slog.String("move_id", m.id), slog.String("from", m.from.Shard.Name),
		slog.String("to", m.to.Shard.Name), slog.Int("aggregates", len(aggs)), slog.Duration("drained_in", time.Since(start)))
	return nil
}

// undo rolls the move back when close failed with a *ConflictError:
// another move holds an aggregate, so this one cannot go on, and its
// reservation on the target would otherwise stay until someone resumed
// it. Other errors leave the move where it got to, for Run or Resume to
// finish.
func (m *mover) undo(ctx context.Context, err error) error {
	var ce *ConflictError
	if !errors.As(err, &ce) {
		return err
	}
	if rbErr := m.rollBack(ctx); rbErr != nil {
		return errors.Join(err, rbErr)
	}
	return fmt.Errorf("%w; this call's move %s from shard %q to %q is rolled back", err, m.id, m.from.Shard.Name, m.to.Shard.Name)
}

// checkDispatch refuses shards whose events change data capture
// publishes: it publishes every inserted row at once, held or not, and
// never sets published_at, which the drain waits for.
func (m *mover) checkDispatch(ctx context.Context) error {
	for _, e := range []struct {
		ep  Endpoint
		sql tables.Moves
	}{{m.from, m.fromSQL}, {m.to, m.toSQL}} {
		var mode string
		if err := e.ep.DB.QueryRow(ctx, e.sql.DispatchMode).Scan(&mode); err != nil {
			return fmt.Errorf("move %s: read the dispatch mode of shard %q: %w", m.id, e.ep.Shard.Name, err)
		}
		if mode != "relay" {
			return fmt.Errorf("move %s: shard %q is dispatched by %s, not by a relay; a move needs relays on both shards (producer.SetDispatch)",
				m.id, e.ep.Shard.Name, mode)
		}
	}
	return nil
}

// inState reads, in tx on the target and under the move's lock, how
// many records the move has there and the first one's state.
func (m *mover) inState(ctx context.Context, tx pgx.Tx) (int, string, error) {
	if _, err := tx.Exec(ctx, m.toSQL.LockMove, m.id); err != nil {
		return 0, "", err
	}
	var n int
	var state *string
	if err := tx.QueryRow(ctx, m.toSQL.InState, m.id).Scan(&n, &state); err != nil {
		return 0, "", err
	}
	if state == nil {
		return n, "", nil
	}
	return n, *state, nil
}

// prepare is step 0: on the target, in one transaction, reserve each
// aggregate: writes there are refused (naming the source) until open.
// Without it, a writer sent to the target by the source's MovedError
// between close and open would number the aggregate from 1 there. It
// refuses an aggregate the target numbered on its own: a sequence row
// that did not move away from it. Preparing again does nothing.
func (m *mover) prepare(ctx context.Context, aggs []Aggregate) error {
	err := pgx.BeginFunc(ctx, m.to.DB, func(tx pgx.Tx) error {
		n, state, err := m.inState(ctx, tx)
		if err != nil {
			return err
		}
		if state == "rolled_back" {
			return fmt.Errorf("%w: %s; start a new move", ErrRolledBack, m.id)
		}
		if n > 0 {
			return nil
		}
		if err := m.checkNumbered(ctx, aggs); err != nil {
			return err
		}
		for _, a := range aggs {
			if _, err := tx.Exec(ctx, m.toSQL.ReserveNew, a.Type, a.ID, m.from.Shard.Name, m.id); err != nil {
				return err
			}
			var (
				have              int64
				movedTo, arriving *string
				move              string
			)
			if err := tx.QueryRow(ctx, m.toSQL.LockTarget, a.Type, a.ID).Scan(&have, &movedTo, &arriving, &move); err != nil {
				return err
			}
			switch {
			case move == m.id:
			case arriving != nil:
				return &ConflictError{Shard: m.to.Shard.Name, Aggregate: a, Move: move,
					Reason: fmt.Sprintf("already arriving from shard %q; move it once that move is done", *arriving)}
			case movedTo == nil:
				in, err := lastMove(ctx, tx, m.toSQL, a, "in")
				if err != nil {
					return err
				}
				if in != "" {
					return &ConflictError{Shard: m.to.Shard.Name, Aggregate: a, Move: in,
						Reason: fmt.Sprintf("already lives here, up to sequence %d, since a move brought it", have)}
				}
				return &ConflictError{Shard: m.to.Shard.Name, Aggregate: a,
					Reason: fmt.Sprintf("has events of its own up to sequence %d; a move expects none", have)}
			}
			if _, err := tx.Exec(ctx, m.toSQL.Reserve, a.Type, a.ID, m.from.Shard.Name, m.id, have); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		var ce *ConflictError
		if errors.As(err, &ce) || errors.Is(err, ErrRolledBack) {
			return err
		}
		return fmt.Errorf("move %s: reserve on shard %q: %w", m.id, m.to.Shard.Name, err)
	}
	m.log.InfoContext(ctx, "move: reserved on target", slog.String("move_id", m.id), slog.String("shard", m.to.Shard.Name))
	return nil
}

// checkNumbered refuses, unless Config.AllowNew, the first of aggs that
// the source never numbered. A sequence only grows, so what this finds
// numbered stays so until the close.
func (m *mover) checkNumbered(ctx context.Context, aggs []Aggregate) error {
	if m.allowNew {
		return nil
	}
	types, ids := make([]string, len(aggs)), make([]string, len(aggs))
	for i, a := range aggs {
		types[i], ids[i] = a.Type, a.ID
	}
	var a Aggregate
	err := m.from.DB.QueryRow(ctx, m.fromSQL.Unnumbered, types, ids).Scan(&a.Type, &a.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look the aggregates up on shard %q: %w", m.from.Shard.Name, err)
	}
	return &ConflictError{Shard: m.from.Shard.Name, Aggregate: a,
		Reason: fmt.Sprintf("has no events here: its events may be on another shard, whose numbers shard %q would reuse; "+
			"move it from the shard whose sequences table has it, or set move.Config.AllowNew (outbox move start -allow-new) "+
			"if it has no events anywhere yet", m.to.Shard.Name)}
}

// lastMove returns the id of the latest move of a recorded on the shard
// of sql in direction ("out" or "in"), or "" when none is.
func lastMove(ctx context.Context, tx pgx.Tx, sql tables.Moves, a Aggregate, direction string) (string, error) {
	var id string
	err := tx.QueryRow(ctx, sql.LastMove, a.Type, a.ID, direction).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return id, err
}

// record is one row of moves.
type record struct {
	agg     Aggregate
	peer    string
	lastSeq int64
	state   string
}

func (m *mover) records(ctx context.Context, db outbox.DB, sql tables.Moves, direction string) ([]record, error) {
	rows, err := db.Query(ctx, sql.Records, m.id, direction)
	if err != nil {
		return nil, fmt.Errorf("move %s: read its records: %w", m.id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (record, error) {
		var rec record
		err := r.Scan(&rec.agg.Type, &rec.agg.ID, &rec.peer, &rec.lastSeq, &rec.state)
		return rec, err
	})
	if err != nil {
		return nil, fmt.Errorf("move %s: read its records: %w", m.id, err)
	}
	return out, nil
}

// close is step 1 (after prepare): on the source, in one transaction, lock each
// aggregate's sequence row, read its last sequence and mark it moved. A
// writer holding the row waits for its commit first, so every sequence up
// to the last one read is committed, and every later write finds the row
// moved. Closing again returns what the first close recorded.
func (m *mover) close(ctx context.Context, aggs []Aggregate) (map[Aggregate]int64, error) {
	lasts := map[Aggregate]int64{}
	err := pgx.BeginFunc(ctx, m.from.DB, func(tx pgx.Tx) error {
		// Another Run of the same move closes in turn: this one then
		// finds its records.
		if _, err := tx.Exec(ctx, m.fromSQL.LockMove, m.id); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, m.fromSQL.Records+" FOR UPDATE", m.id, "out")
		if err != nil {
			return err
		}
		recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (record, error) {
			var rec record
			err := r.Scan(&rec.agg.Type, &rec.agg.ID, &rec.peer, &rec.lastSeq, &rec.state)
			return rec, err
		})
		if err != nil {
			return err
		}
		if len(recs) > 0 {
			if recs[0].state == "rolled_back" {
				return fmt.Errorf("%w: %s; start a new move", ErrRolledBack, m.id)
			}
			if recs[0].peer != m.to.Shard.Name {
				return &ConflictError{Shard: m.from.Shard.Name, Aggregate: recs[0].agg, Move: m.id,
					Reason: fmt.Sprintf("move %s goes to shard %q, not %q; a move id names one move: start a new move", m.id, recs[0].peer, m.to.Shard.Name)}
			}
			for _, r := range recs {
				lasts[r.agg] = r.lastSeq
			}
			return nil
		}
		for _, a := range aggs {
			var (
				last              int64
				movedTo, arriving *string
				move              string
			)
			if err := tx.QueryRow(ctx, m.fromSQL.LockSource, a.Type, a.ID).Scan(&last, &movedTo, &arriving, &move); err != nil {
				return err
			}
			if arriving != nil {
				return &ConflictError{Shard: m.from.Shard.Name, Aggregate: a, Move: move,
					Reason: fmt.Sprintf("is reserved or still arriving from shard %q; let that move finish first", *arriving)}
			}
			if movedTo != nil {
				if move, err = lastMove(ctx, tx, m.fromSQL, a, "out"); err != nil {
					return err
				}
				// A row naming the target at 0, with no move out of here,
				// is what a rolled-back reservation by a move from the
				// target left: this shard never numbered the aggregate,
				// so close it as a new one. Refusing would leave it
				// refused on both shards when the target's row is such a
				// leftover too (two moves of a never-written aggregate,
				// both ways at once).
				if *movedTo != m.to.Shard.Name || last != 0 || move != "" {
					return &ConflictError{Shard: m.from.Shard.Name, Aggregate: a, Move: move,
						Reason: fmt.Sprintf("already moved to shard %q; move it from there", *movedTo)}
				}
			}
			if _, err := tx.Exec(ctx, m.fromSQL.CloseSource, a.Type, a.ID, m.to.Shard.Name, m.id, last); err != nil {
				return err
			}
			lasts[a] = last
		}
		return nil
	})
	if err != nil {
		var ce *ConflictError
		if errors.As(err, &ce) || errors.Is(err, ErrRolledBack) {
			return nil, err
		}
		return nil, fmt.Errorf("move %s: close on shard %q: %w", m.id, m.from.Shard.Name, err)
	}
	m.log.InfoContext(ctx, "move: closed on source", slog.String("move_id", m.id), slog.String("shard", m.from.Shard.Name))
	return lasts, nil
}

// open is step 2: on the target, in one transaction, set each reserved
// aggregate's sequence to the source's last one: it takes writes from
// then on, held until release. Opening again does nothing.
func (m *mover) open(ctx context.Context, lasts map[Aggregate]int64) error {
	err := pgx.BeginFunc(ctx, m.to.DB, func(tx pgx.Tx) error {
		_, state, err := m.inState(ctx, tx)
		if err != nil {
			return err
		}
		switch state {
		case "rolled_back":
			return fmt.Errorf("%w: %s; start a new move", ErrRolledBack, m.id)
		case "arriving", "done":
			return nil
		}
		aggs := make([]Aggregate, 0, len(lasts))
		for a := range lasts {
			aggs = append(aggs, a)
		}
		slices.SortFunc(aggs, compare)
		for _, a := range aggs {
			tag, err := tx.Exec(ctx, m.toSQL.OpenTarget, a.Type, a.ID, lasts[a], m.id)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return &ConflictError{Shard: m.to.Shard.Name, Aggregate: a,
					Reason: fmt.Sprintf("is not reserved by move %s, or is numbered beyond the source's last sequence %d", m.id, lasts[a])}
			}
		}
		return nil
	})
	if err != nil {
		var ce *ConflictError
		if errors.As(err, &ce) || errors.Is(err, ErrRolledBack) {
			return err
		}
		return fmt.Errorf("move %s: open on shard %q: %w", m.id, m.to.Shard.Name, err)
	}
	m.log.InfoContext(ctx, "move: opened on target", slog.String("move_id", m.id), slog.String("shard", m.to.Shard.Name))
	return nil
}

// drain is step 3: wait until the source delivered every event of the
// move's aggregates up to their last sequences, or one of them is dead.
func (m *mover) drain(ctx context.Context) error {
	t := time.NewTicker(m.poll)
	defer t.Stop()
	for {
		var left int64
		if err := m.from.DB.QueryRow(ctx, m.fromSQL.Undelivered, m.id).Scan(&left); err != nil {
			return fmt.Errorf("move %s: count undelivered events on shard %q: %w", m.id, m.from.Shard.Name, err)
		}
		if left == 0 {
			return nil
		}
		rows, err := m.from.DB.Query(ctx, m.fromSQL.Dead, m.id)
		if err != nil {
			return fmt.Errorf("move %s: look for dead events on shard %q: %w", m.id, m.from.Shard.Name, err)
		}
		dead, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadEvent, error) {
			var d DeadEvent
			err := r.Scan(&d.ID, &d.AggregateType, &d.AggregateID, &d.Seq, &d.LastError)
			return d, err
		})
		if err != nil {
			return fmt.Errorf("move %s: look for dead events on shard %q: %w", m.id, m.from.Shard.Name, err)
		}
		if len(dead) > 0 {
			return &BlockedError{MoveID: m.id, Shard: m.from.Shard.Name, Dead: dead}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("move %s: waiting for shard %q to deliver %d event(s): %w", m.id, m.from.Shard.Name, left, ctx.Err())
		case <-t.C:
		}
	}
}

// release is step 4: on the target, in one transaction, end arriving and
// make the held events due. Each sequence row is locked first, so a write
// of the aggregate that holds it commits first and its held event is
// released here (the next statement's snapshot sees it), and a write that
// waits for it finds the aggregate no longer arriving and writes its
// event due. Releasing again does nothing.
func (m *mover) release(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, m.to.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.toSQL.EndArriving, m.id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, m.toSQL.ReleaseHeld, m.id, tables.HeldPrefix+"%"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, m.toSQL.SetState, m.id, "in", "done")
		return err
	})
	if err != nil {
		return fmt.Errorf("move %s: release on shard %q: %w", m.id, m.to.Shard.Name, err)
	}
	m.log.InfoContext(ctx, "move: released on target", slog.String("move_id", m.id), slog.String("shard", m.to.Shard.Name))
	return nil
}

// finish records on the source that the move is done.
func (m *mover) finish(ctx context.Context) error {
	if _, err := m.from.DB.Exec(ctx, m.fromSQL.SetState, m.id, "out", "done"); err != nil {
		return fmt.Errorf("move %s: record it done on shard %q: %w", m.id, m.from.Shard.Name, err)
	}
	return nil
}

// rollBack undoes a move whose target was never opened. Under the
// move's lock on the target it ends the reservation (the target goes on
// refusing the aggregates, naming the source) and records the move rolled
// back, so that a Run still under way cannot open it afterwards; then it
// reopens the aggregates on the source. If the target was opened
// meanwhile it finishes the move instead.
func (m *mover) rollBack(ctx context.Context) error {
	opened := false
	err := pgx.BeginFunc(ctx, m.to.DB, func(tx pgx.Tx) error {
		_, state, err := m.inState(ctx, tx)
		if err != nil {
			return err
		}
		if state == "arriving" || state == "done" {
			opened = true
			return nil
		}
		if _, err := tx.Exec(ctx, m.toSQL.Unreserve, m.id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, m.toSQL.SetState, m.id, "in", "rolled_back")
		return err
	})
	if err != nil {
		return fmt.Errorf("move %s: end the reservation on shard %q: %w", m.id, m.to.Shard.Name, err)
	}
	if m.pause != nil && !opened {
		m.pause(stepTargetRolledBack)
	}
	if opened {
		in, err := m.records(ctx, m.to.DB, m.toSQL, "in")
		if err != nil {
			return err
		}
		aggs := make([]Aggregate, len(in))
		for i, r := range in {
			aggs[i] = r.agg
		}
		return m.run(ctx, aggs)
	}
	err = pgx.BeginFunc(ctx, m.from.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.fromSQL.LockMove, m.id); err != nil {
			return err
		}
		out, err := m.records(ctx, tx, m.fromSQL, "out")
		if err != nil {
			return err
		}
		if len(out) > 0 && out[0].peer != m.to.Shard.Name {
			// The source's records of this id are of a move to another
			// shard (an id used twice): not this one's to undo.
			return nil
		}
		if _, err := tx.Exec(ctx, m.fromSQL.ReopenSource, m.id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, m.fromSQL.SetState, m.id, "out", "rolled_back")
		return err
	})
	if err != nil {
		return fmt.Errorf("move %s: reopen on shard %q: %w", m.id, m.from.Shard.Name, err)
	}
	m.log.InfoContext(ctx, "move: rolled back", slog.String("move_id", m.id), slog.String("shard", m.from.Shard.Name))
	return nil
}

// compare orders aggregates as the sequences' primary key does, the
// order in which writers lock them.
func compare(a, b Aggregate) int {
	if c := strings.Compare(a.Type, b.Type); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}
