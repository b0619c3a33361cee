package move_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/d419a114/outbox/move"
)

// TestList: each shard lists its side of its moves, the latest first, with
// the peer, state and number of aggregates, within the limit.
func TestList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, dst := newSide(t, "s"), newSide(t, "t")
	first, err := move.Run(ctx, src.ep, dst.ep, []move.Aggregate{{Type: "order", ID: "a"}, {Type: "order", ID: "b"}}, cfg)
	require.NoError(t, err)
	second, err := move.Run(ctx, dst.ep, src.ep, []move.Aggregate{{Type: "order", ID: "a"}}, cfg)
	require.NoError(t, err)

	got, err := move.List(ctx, src.db.Pool, src.db.Schema, 0)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, second, got[0].ID, "the latest first")
	require.False(t, got[0].Out)
	require.Equal(t, "t", got[0].Peer)
	require.Equal(t, move.Done, got[0].State)
	require.Equal(t, 1, got[0].Aggregates)
	require.Equal(t, first, got[1].ID)
	require.True(t, got[1].Out)
	require.Equal(t, 2, got[1].Aggregates)
	require.False(t, got[1].StartedAt.IsZero())
	require.False(t, got[1].UpdatedAt.Before(got[1].StartedAt))

	got, err = move.List(ctx, dst.db.Pool, dst.db.Schema, 1)
	require.NoError(t, err)
	require.Len(t, got, 1, "the limit holds")
	require.Equal(t, second, got[0].ID)
	require.True(t, got[0].Out)
	require.Equal(t, "s", got[0].Peer)

	_, err = move.List(ctx, dst.db.Pool, `bad"schema`, 0)
	require.Error(t, err)
}

// TestListModel: on random moves tables (sides of one to four rows, few
// distinct update times, so that sides tie), List returns what grouping
// the whole table would: each side once, newest first (ties: greater id,
// then direction, first), with its state, size and times, within the
// limit.
func TestListModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSide(t, "s")
	base := time.Now().Truncate(time.Second)
	rapid.Check(t, func(rt *rapid.T) {
		_, err := s.db.Pool.Exec(ctx, `TRUNCATE `+s.db.Table("moves"))
		require.NoError(rt, err)
		var want []move.Record
		for k := range rapid.IntRange(0, 30).Draw(rt, "moves") {
			for _, out := range []bool{true, false} {
				if !rapid.Bool().Draw(rt, "side") {
					continue
				}
				r := move.Record{
					ID: fmt.Sprintf("m-%02d", k), Out: out, Peer: rapid.SampledFrom([]string{"t", "u"}).Draw(rt, "peer"),
					State:      rapid.SampledFrom([]move.State{move.Prepared, move.Closed, move.Arriving, move.Done, move.RolledBack}).Draw(rt, "state"),
					Aggregates: rapid.IntRange(1, 4).Draw(rt, "aggregates"),
					UpdatedAt:  base.Add(time.Duration(rapid.IntRange(0, 5).Draw(rt, "updated")) * time.Second),
				}
				r.StartedAt = r.UpdatedAt.Add(-time.Duration(rapid.IntRange(0, 3).Draw(rt, "age")) * time.Second)
				recordSide(rt, s, r)
				want = append(want, r)
			}
		}
		slices.SortFunc(want, func(a, b move.Record) int {
			if c := b.UpdatedAt.Compare(a.UpdatedAt); c != 0 {
				return c
			}
			if c := strings.Compare(b.ID, a.ID); c != 0 {
				return c
			}
			if a.Out == b.Out {
				return 0
			}
			if a.Out {
				return -1 // "out" > "in": out first
			}
			return 1
		})
		limit := rapid.IntRange(1, len(want)+2).Draw(rt, "limit")
		got, err := move.List(ctx, s.db.Pool, s.db.Schema, limit)
		require.NoError(rt, err)
		want = want[:min(limit, len(want))]
		require.Len(rt, got, len(want))
		for i := range want {
			require.Equal(rt, want[i].ID, got[i].ID, "row %d", i)
			require.Equal(rt, want[i].Out, got[i].Out, "row %d", i)
			require.Equal(rt, want[i].Peer, got[i].Peer, "row %d", i)
			require.Equal(rt, want[i].State, got[i].State, "row %d", i)
			require.Equal(rt, want[i].Aggregates, got[i].Aggregates, "row %d", i)
			require.True(rt, want[i].UpdatedAt.Equal(got[i].UpdatedAt), "row %d updated", i)
			require.True(rt, want[i].StartedAt.Equal(got[i].StartedAt), "row %d started", i)
		}
	})
}

// recordSide writes the rows of r, one side of a move, into s's moves
// table, as the move's steps would leave them: one per aggregate, all with
// r's peer, state and times.
func recordSide(tb require.TestingT, s *side, r move.Record) {
	dir := "in"
	if r.Out {
		dir = "out"
	}
	_, err := s.db.Pool.Exec(context.Background(), `INSERT INTO `+s.db.Table("moves")+` (move_id, direction, aggregate_type, aggregate_id, peer, last_seq, state, started_at, updated_at)
SELECT $1, $2, 'order', 'a-' || j, $3, 1, $4, $5, $6 FROM generate_series(1, $7::int) AS j`, r.ID, dir, r.Peer, string(r.State), r.StartedAt, r.UpdatedAt, r.Aggregates)
	require.NoError(tb, err)
}
