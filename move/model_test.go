package move_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/producer"
)

// TestModel interleaves writes on either shard, publishing on either
// shard, moves back and forth taken one step at a time, and Resume after
// any step, each step or Resume also done by two processes at once (two
// pools, held at a gate and let go together), and checks every Write's outcome against a model of where the
// aggregate lives. Whatever the interleaving, the events published from
// both shards, in the order they were published, are sequences 1, 2, 3...
// of the aggregate: no gap, no number used twice, no reorder; and at the
// end, once everything is published, every event written is among them.
func TestModel(t *testing.T) {
	t.Parallel()
	shards := [2]*side{newSide(t, "a"), newSide(t, "b")}
	var iteration atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		h := &modelRun{t: rt, sides: shards, agg: fmt.Sprintf("m%d", iteration.Add(1))}
		steps := rapid.IntRange(1, 40).Draw(rt, "steps")
		for range steps {
			switch rapid.SampledFrom([]string{"write", "write", "publish", "start", "step", "step", "step2", "resume", "resume2"}).Draw(rt, "op") {
			case "write":
				h.write(rapid.IntRange(0, 1).Draw(rt, "shard"))
			case "publish":
				h.publish(rapid.IntRange(0, 1).Draw(rt, "shard"))
			case "start":
				h.start()
			case "step":
				h.step()
			case "step2":
				h.step2()
			case "resume":
				h.resume()
			case "resume2":
				h.resume2()
			}
		}
		h.finish()
	})
}

// modelRun is one sequence of the model on its own aggregate.
type modelRun struct {
	t     *rapid.T
	sides [2]*side
	agg   string
	// home is the shard the aggregate lives on when no move is under way.
	home int
	// known says whether a shard has the aggregate's sequence row: a
	// write on a shard without one would number the aggregate there on its
	// own, which is the application's mistake, not the move's.
	known [2]bool
	// written counts the events written; wire are the sequences
	// published, in publishing order.
	written int64
	wire    []int64
	// mv is the move under way, if any: its id, from and to, and how
	// many steps of it are done (1 prepare, 2 close, 3 open, 4 drain,
	// 5 release, 6 finished).
	mv *modelMove
	n  int
}

type modelMove struct {
	id       string
	from, to int
	done     int
	// allowNew is the move's Config.AllowNew: without it, a move of an
	// aggregate never written is refused at its first step.
	allowNew bool
}

var modelCfg = &move.Config{PollInterval: time.Millisecond, Logger: quiet}

func (h *modelRun) endpoints(m *modelMove) (move.Endpoint, move.Endpoint) {
	return h.sides[m.from].ep, h.sides[m.to].ep
}

// expect says what a write on shard x does now: ok (and whether held), or
// refused naming which shard and whether arriving; skip when the model
// does not write there.
func (h *modelRun) expect(x int) (ok, held bool, to string, arriving, skip bool) {
	name := func(i int) string { return h.sides[i].ep.Shard.Name }
	if m := h.mv; m != nil {
		switch {
		case x == m.from && m.done < 2:
			return true, false, "", false, false
		case x == m.from:
			return false, false, name(m.to), false, false
		case m.done == 0:
			if !h.known[x] {
				return false, false, "", false, true
			}
			return false, false, name(m.from), false, false
		case m.done < 3:
			return false, false, name(m.from), true, false
		default:
			return true, m.done < 5, "", false, false
		}
	}
	if x == h.home {
		return true, false, "", false, false
	}
	if !h.known[x] {
		return false, false, "", false, true
	}
	return false, false, name(h.home), false, false
}

func (h *modelRun) write(x int) {
	ok, held, to, arriving, skip := h.expect(x)
	if skip {
		return
	}
	ctx := context.Background()
	s := h.sides[x]
	tx, err := s.db.Pool.Begin(ctx)
	require.NoError(h.t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	out, err := s.w.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: h.agg, EventType: "e"})
	if !ok {
		var me *producer.MovedError
		require.ErrorAs(h.t, err, &me, "write on %s", s.ep.Shard.Name)
		require.Equal(h.t, to, me.To)
		require.Equal(h.t, arriving, me.Arriving)
		return
	}
	require.NoError(h.t, err, "write on %s", s.ep.Shard.Name)
	require.NoError(h.t, tx.Commit(ctx))
	h.written++
	require.Equal(h.t, h.written, out[0].Seq, "the sequence continues across shards")
	var isHeld bool
	require.NoError(h.t, s.db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT next_attempt_at = 'infinity' FROM %s WHERE id = $1`, s.db.Table("events")), out[0].ID).Scan(&isHeld))
	require.Equal(h.t, held, isHeld, "held while arriving")
	h.known[x] = true
}

// publish does what a relay of shard x would: publish the aggregate's due
// events in id order.
func (h *modelRun) publish(x int) {
	s := h.sides[x]
	rows, err := s.db.Pool.Query(context.Background(), fmt.Sprintf(`
WITH p AS (
    UPDATE %s SET published_at = clock_timestamp()
    WHERE aggregate_id = $1 AND published_at IS NULL AND (attempts = 0 OR next_attempt_at <= now())
    RETURNING id, aggregate_seq)
SELECT aggregate_seq FROM p ORDER BY id`, s.db.Table("events")), h.agg)
	require.NoError(h.t, err)
	for rows.Next() {
		var seq int64
		require.NoError(h.t, rows.Scan(&seq))
		h.wire = append(h.wire, seq)
	}
	require.NoError(h.t, rows.Err())
	for i, seq := range h.wire {
		require.Equal(h.t, int64(i+1), seq, "published in sequence order with no gap: %v", h.wire)
	}
}

func (h *modelRun) start() {
	if h.mv != nil {
		return
	}
	h.n++
	h.mv = &modelMove{id: fmt.Sprintf("%s-%d", h.agg, h.n), from: h.home, to: 1 - h.home, allowNew: rapid.Bool().Draw(h.t, "allow_new")}
}

// refused says whether the move's next step refuses it: the first step
// (prepare) does when the source never numbered the aggregate, unless
// AllowNew.
func (h *modelRun) refused(m *modelMove) bool {
	return m.done == 0 && !m.allowNew && h.written == 0
}

// undelivered counts the aggregate's unpublished events on shard x.
func (h *modelRun) undelivered(x int) int64 {
	s := h.sides[x]
	var n int64
	require.NoError(h.t, s.db.Pool.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT count(*) FROM %s WHERE aggregate_id = $1 AND published_at IS NULL`, s.db.Table("events")), h.agg).Scan(&n))
	return n
}

// step takes the move's next step, by running it again with its id and
// stopping after that step.
func (h *modelRun) step() {
	m := h.mv
	if m == nil {
		return
	}
	next := m.done + 1
	if next >= 4 && h.undelivered(m.from) > 0 {
		return // the drain would wait for the source's relay
	}
	from, to := h.endpoints(m)
	cfg := &move.Config{ID: m.id, PollInterval: modelCfg.PollInterval, Logger: quiet, AllowNew: m.allowNew}
	if next < 6 {
		cfg = move.StopAfter(cfg, next)
	}
	_, err := move.Run(context.Background(), from, to, []move.Aggregate{{Type: "order", ID: h.agg}}, cfg)
	if h.refused(m) {
		h.refuse(err)
		return
	}
	if next < 6 {
		require.ErrorIs(h.t, err, move.ErrStopped)
		m.done = next
		return
	}
	require.NoError(h.t, err)
	h.arrived()
}

// step2 takes the move's next step from two processes at once: two Runs
// with its id, held before their first step and let go together. Both
// end where one would.
func (h *modelRun) step2() {
	m := h.mv
	if m == nil {
		return
	}
	next := m.done + 1
	if next >= 4 && h.undelivered(m.from) > 0 {
		return
	}
	from, to := h.endpoints(m)
	errs := h.twice(0, func(pause func(int)) error {
		cfg := move.PauseAt(&move.Config{ID: m.id, PollInterval: modelCfg.PollInterval, Logger: quiet, AllowNew: m.allowNew}, pause)
		if next < 6 {
			cfg = move.StopAfter(cfg, next)
		}
		_, err := move.Run(context.Background(), from, to, []move.Aggregate{{Type: "order", ID: h.agg}}, cfg)
		return err
	})
	if h.refused(m) {
		h.refuse(errs...)
		return
	}
	for _, err := range errs {
		if next < 6 {
			require.ErrorIs(h.t, err, move.ErrStopped)
		} else {
			require.NoError(h.t, err)
		}
	}
	if next < 6 {
		m.done = next
		return
	}
	h.arrived()
}

// refuse checks that each Run of the move was refused on the source
// before anything changed: no move recorded, the aggregate where it was.
func (h *modelRun) refuse(errs ...error) {
	from, to := h.endpoints(h.mv)
	for _, err := range errs {
		var ce *move.ConflictError
		require.ErrorAs(h.t, err, &ce, "a move of an aggregate never written, without AllowNew")
		require.Equal(h.t, from.Shard.Name, ce.Shard)
	}
	_, err := move.Get(context.Background(), h.mv.id, from, to)
	require.ErrorIs(h.t, err, move.ErrUnknownMove, "the refused move left no record")
	h.mv = nil
}

// resume2 resumes the move from two processes at once, held where they
// collide (the rollback on the target, or the first step) and let go
// together. Both end where one Resume would.
func (h *modelRun) resume2() {
	m := h.mv
	if m == nil {
		return
	}
	if m.done >= 3 && h.undelivered(m.from) > 0 {
		return
	}
	at := 0
	switch {
	case m.done == 0:
		at = -2 // Resume of an unrecorded move reaches no step
	case m.done < 3:
		at = move.StepTargetRolledBack
	}
	from, to := h.endpoints(m)
	errs := h.twice(at, func(pause func(int)) error {
		return move.Resume(context.Background(), m.id, from, to, move.PauseAt(modelCfg, pause))
	})
	for _, err := range errs {
		if m.done == 0 {
			require.ErrorIs(h.t, err, move.ErrUnknownMove)
		} else {
			require.NoError(h.t, err)
		}
	}
	switch {
	case m.done == 0:
		h.mv = nil
	case m.done < 3:
		st, err := move.Get(context.Background(), m.id, from, to)
		require.NoError(h.t, err)
		require.Equal(h.t, move.RolledBack, st.State)
		h.known[m.to], h.mv = true, nil
	default:
		h.arrived()
	}
}

// twice runs f in two goroutines, each with a pause that holds it at step
// at until both got there (at -2: no hold), and returns their errors.
func (h *modelRun) twice(at int, f func(pause func(int)) error) []error {
	g := [2]*gate{newGate(at), newGate(at)}
	errs := make(chan error, 2)
	for _, g := range g {
		go func() { errs <- f(g.pause) }()
	}
	var out []error
	if at != -2 {
		for _, g := range g {
			select {
			case <-g.reached:
			case err := <-errs:
				h.t.Fatalf("a process returned before step %d: %v", at, err)
			case <-time.After(30 * time.Second):
				h.t.Fatalf("a process did not reach step %d", at)
			}
		}
	}
	g[0].open()
	g[1].open()
	for range 2 {
		select {
		case err := <-errs:
			out = append(out, err)
		case <-time.After(60 * time.Second):
			h.t.Fatalf("a process did not return")
		}
	}
	return out
}

func (h *modelRun) arrived() {
	h.home, h.known[h.mv.to], h.mv = h.mv.to, true, nil
}

// resume is what an operator does after a crash: Resume finishes a move
// whose target was opened and rolls back the others.
func (h *modelRun) resume() {
	m := h.mv
	if m == nil {
		return
	}
	if m.done >= 3 && h.undelivered(m.from) > 0 {
		return // it would wait for the source's relay
	}
	from, to := h.endpoints(m)
	err := move.Resume(context.Background(), m.id, from, to, modelCfg)
	switch {
	case m.done == 0:
		require.ErrorIs(h.t, err, move.ErrUnknownMove)
		h.mv = nil
	case m.done < 3:
		require.NoError(h.t, err)
		st, err := move.Get(context.Background(), m.id, from, to)
		require.NoError(h.t, err)
		require.Equal(h.t, move.RolledBack, st.State)
		h.known[m.to], h.mv = true, nil
	default:
		require.NoError(h.t, err)
		h.arrived()
	}
}

// finish publishes everything and completes a move under way, then
// checks that every event written went out, in order.
func (h *modelRun) finish() {
	h.publish(h.home)
	if m := h.mv; m != nil {
		h.publish(m.from)
		for h.mv != nil {
			h.step()
		}
	}
	h.publish(0)
	h.publish(1)
	require.Len(h.t, h.wire, int(h.written), "every event written is published")
	for i := range h.sides {
		require.Zero(h.t, h.undelivered(i), "nothing stays held on shard %d", i)
	}
	if h.mv == nil {
		return
	}
	require.Fail(h.t, "move left under way", errors.New(h.mv.id))
}
