package move_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

// side is one shard of a test: its own schema in the test database.
type side struct {
	db *pgtest.DB
	w  *producer.Writer
	ep move.Endpoint
}

func newSide(t testing.TB, name string) *side {
	t.Helper()
	db := pgtest.New(t, nil)
	return &side{
		db: db,
		w:  producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}),
		ep: move.Endpoint{Shard: shard.Shard{Name: name, Schema: db.Schema}, DB: db.Pool},
	}
}

// write writes one event of aggregate order/id in its own transaction and
// returns its sequence, or Write's error.
func (s *side) write(t *testing.T, id string) (int64, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	out, err := s.w.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: id, EventType: "e", Payload: []byte("{}")})
	if err != nil {
		return 0, err
	}
	require.NoError(t, tx.Commit(ctx))
	return out[0].Seq, nil
}

// publish marks every undelivered, unheld event published, as a relay
// would, and returns how many.
func (s *side) publish(t *testing.T) int64 {
	t.Helper()
	tag, err := s.db.Pool.Exec(context.Background(), fmt.Sprintf(
		`UPDATE %s SET published_at = clock_timestamp() WHERE published_at IS NULL AND (attempts = 0 OR next_attempt_at <= now())`,
		s.db.Table("events")))
	require.NoError(t, err)
	return tag.RowsAffected()
}

// seqs returns the sequences of aggregate id's events on the side and
// how many of them are held.
func (s *side) seqs(t *testing.T, id string) (seqs []int64, held int) {
	t.Helper()
	rows, err := s.db.Pool.Query(context.Background(), fmt.Sprintf(
		`SELECT aggregate_seq, next_attempt_at = 'infinity' FROM %s WHERE aggregate_id = $1 ORDER BY id`, s.db.Table("events")), id)
	require.NoError(t, err)
	for rows.Next() {
		var seq int64
		var h bool
		require.NoError(t, rows.Scan(&seq, &h))
		seqs = append(seqs, seq)
		if h {
			held++
		}
	}
	require.NoError(t, rows.Err())
	return seqs, held
}

var quiet = slog.New(slog.DiscardHandler)

// cfg is the tests' move configuration. They move aggregates before
// their first write too, hence AllowNew; TestMoveRefusesUnnumbered is
// about the default.
var cfg = &move.Config{PollInterval: 5 * time.Millisecond, Logger: quiet, AllowNew: true}

func TestMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SequenceContinuesOnTheTarget", func(t *testing.T) {
		t.Parallel()
		src, dst := newSide(t, "s"), newSide(t, "t")
		for range 3 {
			_, err := src.write(t, "a")
			require.NoError(t, err)
		}
		src.publish(t)
		_, err := move.Run(ctx, src.ep, dst.ep, []move.Aggregate{{Type: "order", ID: "a"}}, cfg)
		require.NoError(t, err)
		seq, err := dst.write(t, "a")
		require.NoError(t, err)
		require.Equal(t, int64(4), seq)
		_, held := dst.seqs(t, "a")
		require.Zero(t, held, "a write after the move is due at once")
	})

	t.Run("WriteOnTheSourceNamesTheTarget", func(t *testing.T) {
		t.Parallel()
		src, dst := newSide(t, "s"), newSide(t, "t")
		_, err := src.write(t, "a")
		require.NoError(t, err)
		src.publish(t)
		_, err = move.Run(ctx, src.ep, dst.ep, []move.Aggregate{{Type: "order", ID: "a"}}, cfg)
		require.NoError(t, err)

		_, err = src.write(t, "a")
		require.ErrorIs(t, err, producer.ErrAggregateMoved)
		var me *producer.MovedError
		require.ErrorAs(t, err, &me)
		require.Equal(t, "t", me.To)
		require.Contains(t, err.Error(), `"t"`)

		// Several events in one call: the moved aggregate is named too.
		tx, err := src.db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = src.w.Write(ctx, tx,
			producer.Event{AggregateType: "order", AggregateID: "b", EventType: "e"},
			producer.Event{AggregateType: "order", AggregateID: "a", EventType: "e"})
		require.ErrorAs(t, err, &me)
		require.Equal(t, "a", me.AggregateID)

		seqs, _ := src.seqs(t, "a")
		require.Equal(t, []int64{1}, seqs, "nothing more written on the source")
	})

	t.Run("TargetHoldsItsEventsUntilTheSourceDelivered", func(t *testing.T) {
		t.Parallel()
		src, dst := newSide(t, "s"), newSide(t, "t")
		for range 2 {
			_, err := src.write(t, "a")
			require.NoError(t, err)
		}
		done := make(chan error, 1)
		var id string
		go func() {
			var err error
			id, err = move.Run(ctx, src.ep, dst.ep, []move.Aggregate{{Type: "order", ID: "a"}},
				&move.Config{ID: "m1", PollInterval: 5 * time.Millisecond, Logger: quiet, AllowNew: true})
			done <- err
		}()
		// The target opens; its writes continue the sequence, held.
		require.Eventually(t, func() bool {
			st, err := move.Get(ctx, "m1", src.ep, dst.ep)
			return err == nil && st.State == move.Arriving
		}, 10*time.Second, 5*time.Millisecond)
		seq, err := dst.write(t, "a")
		require.NoError(t, err)
		require.Equal(t, int64(3), seq)
		_, held := dst.seqs(t, "a")
		require.Equal(t, 1, held)
		require.Zero(t, dst.publish(t), "a held event is not published")
		st, err := move.Get(ctx, "m1", src.ep, dst.ep)
		require.NoError(t, err)
		require.Equal(t, int64(2), st.Undelivered)
		require.Equal(t, int64(1), st.Held)
		require.False(t, st.HeldSince.IsZero())

		src.publish(t)
		require.NoError(t, <-done)
		require.Equal(t, "m1", id)
		_, held = dst.seqs(t, "a")
		require.Zero(t, held)
		require.Equal(t, int64(1), dst.publish(t))
		st, err = move.Get(ctx, "m1", src.ep, dst.ep)
		require.NoError(t, err)
		require.Equal(t, move.Done, st.State)
	})

	t.Run("DeadEventBlocks", func(t *testing.T) {
		t.Parallel()
		src, dst := newSide(t, "s"), newSide(t, "t")
		_, err := src.write(t, "a")
		require.NoError(t, err)
		_, err = src.db.Pool.Exec(ctx, fmt.Sprintf(`
WITH gone AS (DELETE FROM %s RETURNING *)
INSERT INTO %s (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers, created_at, attempts, last_error, hold)
SELECT id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers, created_at, 10, 'boom', true FROM gone`,
			src.db.Table("events"), src.db.Table("dead_events")))
		require.NoError(t, err)
		// Dead events leave events; put an undelivered successor there.
		_, err = src.db.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET last_seq = 1`, src.db.Table("sequences")))
		require.NoError(t, err)
		_, err = src.write(t, "a")
		require.NoError(t, err)

		id, err := move.Run(ctx, src.ep, dst.ep, []move.Aggregate{{Type: "order", ID: "a"}}, cfg)
		var be *move.BlockedError
		require.ErrorAs(t, err, &be)
		require.ErrorIs(t, err, move.ErrBlocked)
		require.Len(t, be.Dead, 1)
		require.Contains(t, err.Error(), "boom")
		require.Contains(t, err.Error(), "move.Resume")

		// The operator discards it; the relay delivers the rest; Resume finishes.
		_, err = src.db.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET status = 'discarded'`, src.db.Table("dead_events")))
		require.NoError(t, err)
		src.publish(t)
		require.NoError(t, move.Resume(ctx, id, src.ep, dst.ep, cfg))
	})

	t.Run("TargetWithItsOwnEventsIsRefused", func(t *testing.T) {
		t.Parallel()
		src, dst := newSide(t, "s"), newSide(t, "t")
		_, err := src.write(t, "a")
		require.NoError(t, err)
		_, err = dst.write(t, "a")
		require.NoError(t, err)
		_, err = move.Run(ctx, src.ep, dst.ep, []move.Aggregate{{Type: "order", ID: "a"}}, cfg)
		var ce *move.ConflictError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "t", ce.Shard)
	})

	t.Run("MovesBackAndForth", func(t *testing.T) {
		t.Parallel()
		src, dst := newSide(t, "s"), newSide(t, "t")
		aggs := []move.Aggregate{{Type: "order", ID: "a"}}
		_, err := src.write(t, "a")
		require.NoError(t, err)
		src.publish(t)
		_, err = move.Run(ctx, src.ep, dst.ep, aggs, cfg)
		require.NoError(t, err)
		_, err = dst.write(t, "a")
		require.NoError(t, err)
		dst.publish(t)
		_, err = move.Run(ctx, dst.ep, src.ep, aggs, cfg)
		require.NoError(t, err)
		seq, err := src.write(t, "a")
		require.NoError(t, err)
		require.Equal(t, int64(3), seq)
		_, err = dst.write(t, "a")
		require.ErrorIs(t, err, producer.ErrAggregateMoved)
	})

	t.Run("WritersRacingEveryStep", func(t *testing.T) {
		t.Parallel()
		src, dst := newSide(t, "s"), newSide(t, "t")
		const writers = 4
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var onSrc, onDst []int64
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					// Write where the aggregate lives, as an application
					// that follows MovedError would.
					seq, err := src.write(t, "a")
					if errors.Is(err, producer.ErrAggregateMoved) {
						seq, err = dst.write(t, "a")
						if err == nil {
							mu.Lock()
							onDst = append(onDst, seq)
							mu.Unlock()
						}
						continue
					}
					if err == nil {
						mu.Lock()
						onSrc = append(onSrc, seq)
						mu.Unlock()
					}
				}
			}()
		}
		relayStop := make(chan struct{})
		relayDone := make(chan struct{})
		go func() {
			defer close(relayDone)
			for {
				select {
				case <-relayStop:
					return
				case <-time.After(time.Millisecond):
					src.publish(t)
				}
			}
		}()
		require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(onSrc) >= 20 }, 10*time.Second, time.Millisecond)
		_, err := move.Run(ctx, src.ep, dst.ep, []move.Aggregate{{Type: "order", ID: "a"}}, cfg)
		require.NoError(t, err)
		require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(onDst) >= 20 }, 10*time.Second, time.Millisecond)
		close(stop)
		wg.Wait()
		close(relayStop)
		<-relayDone

		srcSeqs, _ := src.seqs(t, "a")
		dstSeqs, held := dst.seqs(t, "a")
		require.Zero(t, held, "no event stays held after the release")
		all := append(srcSeqs, dstSeqs...)
		for i, s := range all {
			require.Equal(t, int64(i+1), s, "sequences 1..n with no gap, reuse or reorder in id order: %v", all)
		}
	})
}

// TestCrash stops a move after each step, as a crash there would, and
// checks that Resume finishes it (or rolls it back) and Run with the same
// id finishes it.
func TestCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	aggs := []move.Aggregate{{Type: "order", ID: "a"}, {Type: "order", ID: "b"}}
	for step := 1; step <= 5; step++ {
		for _, how := range []string{"Resume", "RunAgain"} {
			t.Run(fmt.Sprintf("After%d/%s", step, how), func(t *testing.T) {
				t.Parallel()
				src, dst := newSide(t, "s"), newSide(t, "t")
				for _, a := range []string{"a", "a", "b"} {
					_, err := src.write(t, a)
					require.NoError(t, err)
				}
				src.publish(t)
				c := move.StopAfter(&move.Config{ID: "m", PollInterval: 5 * time.Millisecond, Logger: quiet, AllowNew: true}, step)
				_, err := move.Run(ctx, src.ep, dst.ep, aggs, c)
				require.ErrorIs(t, err, move.ErrStopped)
				if how == "Resume" {
					require.NoError(t, move.Resume(ctx, "m", src.ep, dst.ep, cfg))
				} else {
					_, err = move.Run(ctx, src.ep, dst.ep, aggs, &move.Config{ID: "m", PollInterval: 5 * time.Millisecond, Logger: quiet, AllowNew: true})
					require.NoError(t, err)
				}
				st, err := move.Get(ctx, "m", src.ep, dst.ep)
				require.NoError(t, err)
				if step <= 2 && how == "Resume" {
					require.Equal(t, move.RolledBack, st.State)
					seq, err := src.write(t, "a")
					require.NoError(t, err)
					require.Equal(t, int64(3), seq, "the source takes writes again")
					_, err = dst.write(t, "a")
					var me *producer.MovedError
					require.ErrorAs(t, err, &me, "the target refuses them, naming the source")
					require.Equal(t, "s", me.To)
					require.False(t, me.Arriving)
					_, err = move.Run(ctx, src.ep, dst.ep, aggs, &move.Config{ID: "m", Logger: quiet, AllowNew: true})
					require.ErrorIs(t, err, move.ErrRolledBack)
					return
				}
				require.Equal(t, move.Done, st.State)
				seq, err := dst.write(t, "a")
				require.NoError(t, err)
				require.Equal(t, int64(3), seq)
				seq, err = dst.write(t, "b")
				require.NoError(t, err)
				require.Equal(t, int64(2), seq)
				_, err = src.write(t, "b")
				require.ErrorIs(t, err, producer.ErrAggregateMoved)
			})
		}
	}
}

// TestMoveRefusesUnnumbered: by default a move refuses, before anything
// changes, an aggregate the source never numbered, such as one whose
// events are on a third shard (the target would reuse their numbers);
// with AllowNew it moves such an aggregate, which starts at 1 on the
// target.
func TestMoveRefusesUnnumbered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, dst, u := newSide(t, "s"), newSide(t, "t"), newSide(t, "u")
	for range 3 {
		_, err := u.write(t, "x")
		require.NoError(t, err)
	}
	_, err := s.write(t, "y")
	require.NoError(t, err)
	s.publish(t)
	strict := &move.Config{ID: "m1", PollInterval: 5 * time.Millisecond, Logger: quiet}

	_, err = move.Run(ctx, s.ep, dst.ep, []move.Aggregate{{Type: "order", ID: "y"}, {Type: "order", ID: "x"}}, strict)
	var ce *move.ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "s", ce.Shard)
	require.Equal(t, move.Aggregate{Type: "order", ID: "x"}, ce.Aggregate, "the aggregate s never numbered")
	require.ErrorContains(t, err, "AllowNew")
	_, err = move.Get(ctx, "m1", s.ep, dst.ep)
	require.ErrorIs(t, err, move.ErrUnknownMove, "nothing of the move was recorded")
	for _, side := range []*side{s, dst} {
		var rows int
		require.NoError(t, side.db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE aggregate_id = 'x' OR moved_to IS NOT NULL`,
			side.db.Table("sequences"))).Scan(&rows))
		require.Zero(t, rows, "shard %s: no sequence row created, closed or reserved", side.ep.Shard.Name)
	}
	seq, err := s.write(t, "y")
	require.NoError(t, err, "y still lives on s")
	require.Equal(t, int64(2), seq)
	s.publish(t)

	strict.ID = "m2"
	_, err = move.Run(ctx, s.ep, dst.ep, []move.Aggregate{{Type: "order", ID: "y"}}, strict)
	require.NoError(t, err, "y was numbered on s")
	seq, err = dst.write(t, "y")
	require.NoError(t, err)
	require.Equal(t, int64(3), seq)

	_, err = move.Run(ctx, s.ep, dst.ep, []move.Aggregate{{Type: "order", ID: "z"}},
		&move.Config{ID: "m3", PollInterval: 5 * time.Millisecond, Logger: quiet, AllowNew: true})
	require.NoError(t, err, "z has no events anywhere")
	seq, err = dst.write(t, "z")
	require.NoError(t, err)
	require.Equal(t, int64(1), seq)
}
