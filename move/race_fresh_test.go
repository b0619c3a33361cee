package move_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/producer"
)

// TestRaceNeverWritten moves an aggregate that no shard has a sequence
// row for from A to B while a move of it from B to A runs. Each
// reservation creates the aggregate's row on its target, naming the other
// shard; a rolled-back one leaves it so. The close on A then finds A's
// row naming B, its own target, at sequence 0 with no move out of A:
// a leftover, not a move away, so the A to B move closes it and goes on,
// and the aggregate ends on B rather than refused on both shards.
func TestRaceNeverWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	aggs := []move.Aggregate{{Type: "order", ID: "n"}}

	// lives checks that a write on from is refused naming to and one on
	// to is sequence 1.
	lives := func(t *testing.T, from, to *side) {
		t.Helper()
		_, err := from.write(t, "n")
		var me *producer.MovedError
		require.ErrorAs(t, err, &me)
		require.Equal(t, to.ep.Shard.Name, me.To)
		require.False(t, me.Arriving)
		seq, err := to.write(t, "n")
		require.NoError(t, err, "the aggregate lives on %s", to.ep.Shard.Name)
		require.Equal(t, int64(1), seq)
	}

	t.Run("BackWhileHeld", func(t *testing.T) {
		t.Parallel()
		a, b := newSide(t, "A"), newSide(t, "B")
		g := newGate(1)
		r := make(chan error, 1)
		go func() {
			_, err := move.Run(ctx, a.ep, b.ep, aggs, move.PauseAt(&move.Config{ID: "m1", PollInterval: cfg.PollInterval, Logger: quiet, AllowNew: true}, g.pause))
			r <- err
		}()
		<-g.reached
		_, err := move.Run(ctx, b.ep, a.ep, aggs, &move.Config{ID: "m2", Logger: quiet, AllowNew: true})
		requireConflict(t, err, "m1")
		g.open()
		require.NoError(t, <-r)
		st, err := move.Get(ctx, "m2", b.ep, a.ep)
		require.NoError(t, err)
		require.Equal(t, move.RolledBack, st.State)
		lives(t, a, b)
	})

	t.Run("BothWaysAtOnce", func(t *testing.T) {
		t.Parallel()
		a, b := newSide(t, "A"), newSide(t, "B")
		g1, g2 := newGate(1), newGate(1)
		r1, r2 := make(chan error, 1), make(chan error, 1)
		go func() {
			_, err := move.Run(ctx, a.ep, b.ep, aggs, move.PauseAt(&move.Config{ID: "m1", PollInterval: cfg.PollInterval, Logger: quiet, AllowNew: true}, g1.pause))
			r1 <- err
		}()
		go func() {
			_, err := move.Run(ctx, b.ep, a.ep, aggs, move.PauseAt(&move.Config{ID: "m2", PollInterval: cfg.PollInterval, Logger: quiet, AllowNew: true}, g2.pause))
			r2 <- err
		}()
		<-g1.reached
		<-g2.reached
		g1.open()
		g2.open()
		// Each close may find the other's reservation, and both roll
		// back; or one rolled back first and the other goes on.
		err1, err2 := <-r1, <-r2
		for _, err := range []error{err1, err2} {
			var ce *move.ConflictError
			if err != nil {
				require.ErrorAs(t, err, &ce)
			}
		}
		require.False(t, err1 == nil && err2 == nil, "both moves succeeded")
		switch {
		case err2 == nil:
			lives(t, b, a)
		case err1 == nil:
			lives(t, a, b)
		default:
			// Moving it again settles it.
			_, err := move.Run(ctx, a.ep, b.ep, aggs, cfg)
			require.NoError(t, err)
			lives(t, a, b)
		}
	})
}
