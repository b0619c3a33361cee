package ordering_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/ordering"
)

func TestList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	tr, err := ordering.New("svc", &ordering.Config{Schema: db.Schema})
	require.NoError(t, err)
	// Three aggregates, each with its first record missing and seqs 2..4
	// parked behind it.
	for _, id := range []string{"a", "b", "c"} {
		a := ordering.Aggregate{Type: "order", ID: id}
		for seq := int64(2); seq <= 4; seq++ {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			c, err := tr.Check(ctx, tx, a, seq)
			require.NoError(t, err)
			require.Equal(t, ordering.Gap, c.Verdict)
			ok, err := tr.Park(ctx, tx, a, seq, &kgo.Record{Topic: "orders", Offset: seq, Key: []byte(id), Value: []byte{byte(seq)},
				Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("v")}}}, id+"-key")
			require.NoError(t, err)
			require.True(t, ok)
			require.NoError(t, tx.Commit(ctx))
		}
	}

	t.Run("ListGapsPagesAndAgreesWithGaps", func(t *testing.T) {
		t.Parallel()
		all, err := tr.Gaps(ctx, db.Pool)
		require.NoError(t, err)
		require.Len(t, all, 3)
		first, err := tr.ListGaps(ctx, db.Pool, &ordering.GapOpts{Limit: 2})
		require.NoError(t, err)
		require.Equal(t, all[:2], first.Gaps)
		require.Equal(t, &ordering.Aggregate{Type: "order", ID: "b"}, first.Next)
		rest, err := tr.ListGaps(ctx, db.Pool, &ordering.GapOpts{Limit: 2, After: first.Next})
		require.NoError(t, err)
		require.Equal(t, all[2:], rest.Gaps)
		require.Nil(t, rest.Next, "the last page")
		one, err := tr.ListGaps(ctx, db.Pool, &ordering.GapOpts{AggregateType: "order", AggregateID: "b"})
		require.NoError(t, err)
		require.Equal(t, all[1:2], one.Gaps)
		none, err := tr.ListGaps(ctx, db.Pool, &ordering.GapOpts{AggregateID: "zzz"})
		require.NoError(t, err)
		require.Empty(t, none.Gaps)
		old, err := tr.ListGaps(ctx, db.Pool, &ordering.GapOpts{ParkedBefore: all[0].Since.Add(-time.Hour)})
		require.NoError(t, err)
		require.Empty(t, old.Gaps, "none parked an hour before the first")
	})

	t.Run("ListParkedPagesInSequenceOrder", func(t *testing.T) {
		t.Parallel()
		b := ordering.Aggregate{Type: "order", ID: "b"}
		first, err := tr.ListParked(ctx, db.Pool, b, 0, 2)
		require.NoError(t, err)
		require.Len(t, first, 2)
		require.Equal(t, []int64{2, 3}, []int64{first[0].Seq, first[1].Seq})
		require.Equal(t, b, first[0].Aggregate)
		require.Equal(t, "b-key", first[0].IdempotencyKey)
		require.Equal(t, []byte{2}, first[0].Record.Value)
		require.Empty(t, first[0].Record.Headers, "a listing reads no headers")
		require.False(t, first[0].ParkedAt.IsZero())
		rest, err := tr.ListParked(ctx, db.Pool, b, first[1].Seq, 2)
		require.NoError(t, err)
		require.Len(t, rest, 1)
		require.EqualValues(t, 4, rest[0].Seq)
		none, err := tr.ListParked(ctx, db.Pool, ordering.Aggregate{Type: "order", ID: "zzz"}, 0, 0)
		require.NoError(t, err)
		require.Empty(t, none)
	})
}
