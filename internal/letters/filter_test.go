package letters_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/letters"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/internal/tables"
)

func TestFiltersAndGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	s := letters.New(tables.For(db.Schema).DeadLetters)
	offset := int64(0)
	add := func(topic, agg string, seq int64, reason deadletter.Reason, failure string) int64 {
		t.Helper()
		offset++
		id, err := put(ctx, s, db.Pool, &deadletter.Letter{Consumer: "svc", Record: &kgo.Record{Topic: topic, Offset: offset, Value: []byte("v")},
			AggregateType: "order", AggregateID: agg, Seq: seq, Error: failure, Reason: reason, Failure: failure})
		require.NoError(t, err)
		return id
	}
	b5 := add("orders", "b", 5, deadletter.ReasonHandler, "handler: broken")
	a3 := add("orders", "a", 3, deadletter.ReasonPanic, "panic at main.handle")
	free := add("payments", "", 0, deadletter.ReasonInput, "input: no key")
	a1 := add("orders", "a", 1, deadletter.ReasonHandler, "handler: broken")
	b2 := add("orders", "b", 2, deadletter.ReasonHandler, "handler: broken")
	_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("parked")+` (consumer, aggregate_type, aggregate_id, seq, topic, kafka_partition, kafka_offset, value, header_keys, header_values)
		VALUES ('svc', 'order', 'a', 2, 'orders', 0, 100, 'v', '{}', '{}'), ('svc', 'order', 'b', 3, 'orders', 0, 101, 'v', '{}', '{}'),
			('svc', 'order', 'c', 9, 'orders', 0, 102, 'v', '{}', '{}')`)
	require.NoError(t, err)

	t.Run("MatchTakesAggregatesInSequenceOrderUnsequencedLast", func(t *testing.T) {
		refs, err := s.Match(ctx, db.Pool, &deadletter.ListOpts{Consumer: "svc", Status: deadletter.StatusDead})
		require.NoError(t, err)
		var ids []int64
		for _, r := range refs {
			ids = append(ids, r.ID)
		}
		require.Equal(t, []int64{a1, a3, b2, b5, free}, ids)
		require.Equal(t, deadletter.Ref{ID: a3, AggregateType: "order", AggregateID: "a", Seq: 3}, refs[1])
	})

	t.Run("Filters", func(t *testing.T) {
		for name, tt := range map[string]struct {
			opts deadletter.ListOpts
			want []int64
		}{
			"Reason":       {deadletter.ListOpts{Reason: deadletter.ReasonHandler}, []int64{b5, a1, b2}},
			"Failure":      {deadletter.ListOpts{Failure: "panic at main.handle"}, []int64{a3}},
			"Topic":        {deadletter.ListOpts{Topic: "payments"}, []int64{free}},
			"FailedBefore": {deadletter.ListOpts{FailedBefore: time.Now().Add(-time.Hour)}, nil},
			"FailedAfter":  {deadletter.ListOpts{FailedAfter: time.Now().Add(-time.Hour), AggregateID: "b"}, []int64{b5, b2}},
		} {
			ls, err := s.List(ctx, db.Pool, &tt.opts)
			require.NoError(t, err, name)
			var ids []int64
			for _, l := range ls {
				ids = append(ids, l.ID)
			}
			require.Equal(t, tt.want, ids, name)
		}
		for name, opts := range map[string]*deadletter.ListOpts{
			"Reason": {Reason: "handlr"}, "Status": {Status: "deleted"},
		} {
			_, err := s.List(ctx, db.Pool, opts)
			require.Error(t, err, name)
			_, err = s.Match(ctx, db.Pool, opts)
			require.Error(t, err, name)
			_, err = s.Preview(ctx, db.Pool, opts)
			require.Error(t, err, name)
		}
		_, err := s.List(ctx, db.Pool, &deadletter.ListOpts{Reason: "handlr"})
		require.ErrorContains(t, err, `unknown reason "handlr"; want one of handler, panic, timeout, sequence, input, delivery_limit`)
		l, err := s.Get(ctx, db.Pool, a3)
		require.NoError(t, err)
		require.Equal(t, deadletter.ReasonPanic, l.Reason)
		require.Equal(t, "panic at main.handle", l.Failure)
	})

	t.Run("PreviewCountsLettersAggregatesAndTheirParkedRecords", func(t *testing.T) {
		p, err := s.Preview(ctx, db.Pool, &deadletter.ListOpts{Consumer: "svc", Reason: deadletter.ReasonHandler})
		require.NoError(t, err)
		require.Equal(t, deadletter.Preview{Letters: 3, Aggregates: 2, Parked: 2}, p)
		p, err = s.Preview(ctx, db.Pool, &deadletter.ListOpts{Consumer: "svc", Topic: "payments"})
		require.NoError(t, err)
		require.Equal(t, deadletter.Preview{Letters: 1}, p)
	})

	t.Run("FailuresGroupTheOpenLettersLargestFirst", func(t *testing.T) {
		fs, err := s.Failures(ctx, db.Pool, "svc", 0)
		require.NoError(t, err)
		require.Len(t, fs, 3)
		require.Equal(t, "handler: broken", fs[0].Failure)
		require.Equal(t, deadletter.ReasonHandler, fs[0].Reason)
		require.EqualValues(t, 3, fs[0].Count)
		require.Equal(t, b5, fs[0].SampleID)
		require.False(t, fs[0].Newest.Before(fs[0].Oldest))
		fs, err = s.Failures(ctx, db.Pool, "svc", 1)
		require.NoError(t, err)
		require.Len(t, fs, 1)
	})
}
