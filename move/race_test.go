package move_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/move"
)

// The tests below make two movers collide on purpose, each with its own
// pool as two processes would: gates hold them at a step, then release
// them. Writers and a relay run throughout (world), and afterwards every
// aggregate lives on exactly one shard with its sequence unbroken on the
// wire, and every move is finished, rolled back or never recorded.

var xy, yz = []string{"x", "y"}, []string{"y", "z"}

// requireConflict checks that err is a *move.ConflictError naming move
// other.
func requireConflict(t *testing.T, err error, other string) {
	t.Helper()
	var ce *move.ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, other, ce.Move, "the conflict names the other move: %v", err)
	require.Contains(t, err.Error(), other)
}

// TestRaceTogether starts two moves of the same aggregates at once.
func TestRaceTogether(t *testing.T) {
	t.Parallel()

	t.Run("SameAggregatesNewIDs", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t, "x", "y", "z")
		g1, g2 := newGate(0), newGate(0)
		r1 := w.goRun("A", "B", "m1", xy, g1.pause)
		r2 := w.goRun("A", "B", "m2", xy, g2.pause)
		g1.wait(t, r1)
		g2.wait(t, r2)
		g1.open()
		g2.open()
		a, b := get(t, r1), get(t, r2)
		if a.err != nil {
			a, b = b, a
		}
		require.NoError(t, a.err)
		requireConflict(t, b.err, a.id)
		require.Equal(t, move.Done, w.ended("A", "B", a.id))
		require.Equal(t, move.State(""), w.ended("A", "B", b.id), "the loser recorded nothing")
		w.finish()
	})

	for step := 0; step <= 5; step++ {
		t.Run(fmt.Sprintf("SameID/After%d", step), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, "x", "y", "z")
			g1, g2 := newGate(step), newGate(step)
			r1 := w.goRun("A", "B", "m", xy, g1.pause)
			if step > 0 {
				// The first one's steps up to here are done; the second
				// one does them again, then both go on at once.
				g1.wait(t, r1)
			}
			r2 := w.goRun("A", "B", "m", xy, g2.pause)
			bothSucceed(t, g1, r1, g2, r2)
			require.Equal(t, move.Done, w.ended("A", "B", "m"))
			w.finish()
		})
	}

	// Two moves prepared on their targets close the same source at once.
	for _, c := range []struct {
		name     string
		id2      string
		to2      string
		aggs2    []string
		together int
	}{
		{"DifferentTargets", "m2", "C", xy, 1},
		{"DifferentTargetsSameID", "m1", "C", xy, 1},
		{"OverlappingSameTarget", "m2", "B", yz, 0},
		{"OverlappingDifferentTargets", "m2", "C", yz, 1},
		// The back move loses: A numbered the aggregates itself (no
		// other move to name) or B has them reserved by m1; unless m1
		// released them on B before the back move closed B: then both
		// succeed, one after the other.
		{"BackAgainst", "m2", "A", xy, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, "x", "y", "z")
			from2 := "A"
			if c.to2 == "A" {
				from2 = "B"
			}
			g1, g2 := newGate(c.together), newGate(c.together)
			r1 := w.goRun("A", "B", "m1", xy, g1.pause)
			g1.wait(t, r1)
			r2 := w.goRun(from2, c.to2, c.id2, c.aggs2, g2.pause)
			g2.wait(t, r2)
			g1.open()
			g2.open()
			a, b := get(t, r1), get(t, r2)
			aFrom, aTo, bFrom, bTo := "A", "B", from2, c.to2
			if a.err != nil {
				a, b = b, a
				aFrom, aTo, bFrom, bTo = bFrom, bTo, aFrom, aTo
			}
			require.NoError(t, a.err)
			switch {
			case c.id2 == "m1":
				var ce *move.ConflictError
				require.ErrorAs(t, b.err, &ce)
				require.Contains(t, b.err.Error(), "new move")
			case c.to2 == "A" && b.err == nil:
				require.Equal(t, move.Done, w.ended(bFrom, bTo, b.id))
			case c.to2 == "A":
				require.Equal(t, "m2", b.id)
				var ce *move.ConflictError
				require.ErrorAs(t, b.err, &ce)
				require.Contains(t, []string{"", "m1"}, ce.Move)
			default:
				requireConflict(t, b.err, a.id)
			}
			require.Equal(t, move.Done, w.ended(aFrom, aTo, a.id))
			if b.err != nil {
				require.Contains(t, []move.State{"", move.RolledBack}, w.ended(bFrom, bTo, b.id), "the loser is rolled back")
			}
			if c.id2 == "m1" {
				// Resuming the loser's side must not reopen the source.
				require.NoError(t, w.resume(bFrom, bTo, b.id, nil))
			}
			w.finish()
		})
	}
}

// TestRaceAtEveryStep holds move m1 (x and y from A to B) after each of
// its steps while another move runs to its end, then lets m1 go on.
func TestRaceAtEveryStep(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		from, to string
		id       string
		aggs     []string
	}{
		{"SameMoveNewID", "A", "B", "m2", xy},
		{"OtherTarget", "A", "C", "m2", xy},
		{"OtherTargetSameID", "A", "C", "m1", xy},
		{"Back", "B", "A", "m2", xy},
		{"Overlapping", "A", "B", "m2", yz},
		{"OverlappingOtherTarget", "A", "C", "m2", yz},
	} {
		for step := 0; step <= 5; step++ {
			t.Run(fmt.Sprintf("%s/After%d", c.name, step), func(t *testing.T) {
				t.Parallel()
				w := newWorld(t, "x", "y", "z")
				g := newGate(step)
				r1 := w.goRun("A", "B", "m1", xy, g.pause)
				g.wait(t, r1)
				_, err2 := w.run(c.from, c.to, c.id, c.aggs, nil)
				g.open()
				err1 := get(t, r1).err
				for _, err := range []error{err1, err2} {
					var ce *move.ConflictError
					if err != nil && !errors.As(err, &ce) {
						t.Fatalf("a move failed other than by a conflict: %v", err)
					}
				}
				require.True(t, err1 == nil || err2 == nil, "one of the moves succeeds: %v; %v", err1, err2)
				w.ended("A", "B", "m1")
				w.ended(c.from, c.to, c.id)
				w.finish()
			})
		}
	}
}

// TestRaceResume resumes a move from two processes at once, and while a
// Run of it is still under way.
func TestRaceResume(t *testing.T) {
	t.Parallel()
	for step := 1; step <= 5; step++ {
		t.Run(fmt.Sprintf("Twice/After%d", step), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, "x", "y", "z")
			_, err := w.runStopped("A", "B", "m", xy, step)
			require.ErrorIs(t, err, move.ErrStopped)
			// Both roll back on the target, or both start over, at once.
			at := 0
			if step <= 2 {
				at = move.StepTargetRolledBack
			}
			g1, g2 := newGate(at), newGate(at)
			r1, r2 := w.goResume("A", "B", "m", g1.pause), w.goResume("A", "B", "m", g2.pause)
			bothSucceed(t, g1, r1, g2, r2)
			want := move.Done
			if step <= 2 {
				want = move.RolledBack
			}
			require.Equal(t, want, w.ended("A", "B", "m"))
			w.finish()
		})
	}

	for step := 0; step <= 5; step++ {
		t.Run(fmt.Sprintf("WhileRunning/After%d", step), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, "x", "y", "z")
			g := newGate(step)
			r := w.goRun("A", "B", "m", xy, g.pause)
			g.wait(t, r)
			err := w.resume("A", "B", "m", nil)
			g.open()
			runErr := get(t, r).err
			switch {
			case step == 0:
				require.ErrorIs(t, err, move.ErrUnknownMove)
				require.NoError(t, runErr)
				require.Equal(t, move.Done, w.ended("A", "B", "m"))
			case step <= 2:
				require.NoError(t, err)
				require.ErrorIs(t, runErr, move.ErrRolledBack)
				require.Equal(t, move.RolledBack, w.ended("A", "B", "m"))
			default:
				require.NoError(t, err)
				require.NoError(t, runErr)
				require.Equal(t, move.Done, w.ended("A", "B", "m"))
			}
			w.finish()
		})
	}

	// The Run goes on while a Resume rolled the target back but has not
	// reopened the source yet.
	for step := 1; step <= 2; step++ {
		t.Run(fmt.Sprintf("RunDuringRollback/After%d", step), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, "x", "y", "z")
			g1, g2 := newGate(step), newGate(move.StepTargetRolledBack)
			r1 := w.goRun("A", "B", "m", xy, g1.pause)
			g1.wait(t, r1)
			r2 := w.goResume("A", "B", "m", g2.pause)
			g2.wait(t, r2)
			g1.open()
			require.ErrorIs(t, get(t, r1).err, move.ErrRolledBack)
			g2.open()
			require.NoError(t, get(t, r2).err)
			require.Equal(t, move.RolledBack, w.ended("A", "B", "m"))
			w.finish()
		})
	}
}
