package sequence_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/internal/sequence"
	"github.com/d419a114/outbox/internal/tables"
	"github.com/d419a114/outbox/ordering"
)

func TestList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	tr, err := sequence.New("svc", &sequence.Config{Schema: db.Schema})
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
			require.Equal(t, sequence.Gap, c.Verdict)
			ok, err := tr.Park(ctx, tx, a, seq, &kgo.Record{Topic: "orders", Offset: seq, Key: []byte(id), Value: []byte{byte(seq)},
				Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("v")}}}, id+"-key")
			require.NoError(t, err)
			require.True(t, ok)
			require.NoError(t, tx.Commit(ctx))
		}
	}

	sql := tables.For(db.Schema)
	t.Run("ListGapsPagesAndAgreesWithGap", func(t *testing.T) {
		t.Parallel()
		var all []ordering.OpenGap
		for _, id := range []string{"a", "b", "c"} {
			g, err := tr.Gap(ctx, db.Pool, ordering.Aggregate{Type: "order", ID: id})
			require.NoError(t, err)
			require.NotNil(t, g)
			all = append(all, *g)
		}
		_, err := sequence.ListGaps(ctx, db.Pool, sql.Parked, &ordering.GapOpts{})
		require.ErrorContains(t, err, "GapOpts.Consumer is empty")
		first, err := sequence.ListGaps(ctx, db.Pool, sql.Parked, &ordering.GapOpts{Consumer: "svc", Limit: 2})
		require.NoError(t, err)
		require.Equal(t, all[:2], first.Gaps)
		require.Equal(t, &ordering.Aggregate{Type: "order", ID: "b"}, first.Next)
		rest, err := sequence.ListGaps(ctx, db.Pool, sql.Parked, &ordering.GapOpts{Consumer: "svc", Limit: 2, After: first.Next})
		require.NoError(t, err)
		require.Equal(t, all[2:], rest.Gaps)
		require.Nil(t, rest.Next, "the last page")
		one, err := sequence.ListGaps(ctx, db.Pool, sql.Parked, &ordering.GapOpts{Consumer: "svc", AggregateType: "order", AggregateID: "b"})
		require.NoError(t, err)
		require.Equal(t, all[1:2], one.Gaps)
		none, err := sequence.ListGaps(ctx, db.Pool, sql.Parked, &ordering.GapOpts{Consumer: "svc", AggregateID: "zzz"})
		require.NoError(t, err)
		require.Empty(t, none.Gaps)
		old, err := sequence.ListGaps(ctx, db.Pool, sql.Parked, &ordering.GapOpts{Consumer: "svc", ParkedBefore: all[0].Since.Add(-time.Hour)})
		require.NoError(t, err)
		require.Empty(t, old.Gaps, "none parked an hour before the first")
	})

	t.Run("ListParkedPagesInSequenceOrder", func(t *testing.T) {
		t.Parallel()
		b := ordering.Aggregate{Type: "order", ID: "b"}
		first, err := sequence.ListParked(ctx, db.Pool, sql.Parked, "svc", b, 0, 2)
		require.NoError(t, err)
		require.Len(t, first, 2)
		require.Equal(t, []int64{2, 3}, []int64{first[0].Seq, first[1].Seq})
		require.Equal(t, b, first[0].Aggregate)
		require.Equal(t, "b-key", first[0].IdempotencyKey)
		require.Equal(t, []byte{2}, first[0].Record.Value)
		require.Empty(t, first[0].Record.Headers, "a listing reads no headers")
		require.False(t, first[0].ParkedAt.IsZero())
		rest, err := sequence.ListParked(ctx, db.Pool, sql.Parked, "svc", b, first[1].Seq, 2)
		require.NoError(t, err)
		require.Len(t, rest, 1)
		require.EqualValues(t, 4, rest[0].Seq)
		none, err := sequence.ListParked(ctx, db.Pool, sql.Parked, "svc", ordering.Aggregate{Type: "order", ID: "zzz"}, 0, 0)
		require.NoError(t, err)
		require.Empty(t, none)
	})
}
