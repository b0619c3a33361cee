package move_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

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
