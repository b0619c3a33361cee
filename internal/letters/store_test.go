package letters_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/letters"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/internal/tables"
)

func TestStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*letters.Store, *pgtest.DB) {
		t.Helper()
		db := pgtest.New(t, nil)
		return letters.New(tables.For(db.Schema).DeadLetters), db
	}
	letter := func(consumer, topic string, offset int64, aggID string) *deadletter.Letter {
		return &deadletter.Letter{
			Consumer: consumer,
			Record: &kgo.Record{Topic: topic, Partition: 2, Offset: offset, Key: []byte(aggID), Value: []byte{0, 1, 0xff},
				Timestamp: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
				Headers:   []kgo.RecordHeader{{Key: "bin", Value: []byte{0xc3, 0x28, 0}}, {Key: "empty"}}},
			IdempotencyKey: "k-" + aggID,
			AggregateType:  "order", AggregateID: aggID, Seq: 3,
			Error: "boom", Stack: "goroutine 1", Attempts: 3,
		}
	}

	t.Run("PutKeepsTheWholeRecord", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		in := letter("svc", "orders", 7, "o-1")
		id, err := put(ctx, s, db.Pool, in)
		require.NoError(t, err)
		got, err := s.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, in.Record.Topic, got.Record.Topic)
		require.Equal(t, in.Record.Partition, got.Record.Partition)
		require.Equal(t, in.Record.Offset, got.Record.Offset)
		require.Equal(t, in.Record.Key, got.Record.Key)
		require.Equal(t, in.Record.Value, got.Record.Value)
		require.True(t, in.Record.Timestamp.Equal(got.Record.Timestamp))
		require.Equal(t, []kgo.RecordHeader{{Key: "bin", Value: []byte{0xc3, 0x28, 0}}, {Key: "empty", Value: []byte{}}}, got.Record.Headers)
		require.Equal(t, "k-o-1", got.IdempotencyKey)
		require.Equal(t, "o-1", got.AggregateID)
		require.EqualValues(t, 3, got.Seq)
		require.Equal(t, "boom", got.Error)
		require.Equal(t, "goroutine 1", got.Stack)
		require.Equal(t, 3, got.Attempts)
		require.Equal(t, deadletter.StatusDead, got.Status)
		require.Nil(t, got.ResolvedAt)
	})

	t.Run("HeaderNamesThatAreNotTextSurvive", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		in := letter("svc", "orders", 1, "o-1")
		in.Record.Headers = []kgo.RecordHeader{{Key: "a\x00b\xff", Value: []byte("v")}}
		in.Error = "bad \xff error"
		id, err := put(ctx, s, db.Pool, in)
		require.NoError(t, err)
		got, err := s.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, "a\uFFFDb\uFFFD", got.Record.Headers[0].Key)
		require.Equal(t, []byte("v"), got.Record.Headers[0].Value)
	})

	t.Run("PutTwiceUpdatesOneRow", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		id1, err := put(ctx, s, db.Pool, letter("svc", "orders", 7, "o-1"))
		require.NoError(t, err)
		again := letter("svc", "orders", 7, "o-1")
		again.Error = "boom again"
		id2, err := put(ctx, s, db.Pool, again)
		require.NoError(t, err)
		require.Equal(t, id1, id2)
		got, err := s.Get(ctx, db.Pool, id1)
		require.NoError(t, err)
		require.Equal(t, 6, got.Attempts)
		require.Equal(t, "boom again", got.Error)
	})

	t.Run("HistoryKeepsEachFailureNewestTwenty", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		var id int64
		for i := range 25 {
			in := letter("svc", "orders", 7, "o-1")
			in.Error, in.Attempts = fmt.Sprintf("boom %d", i), i+1
			var err error
			id, err = put(ctx, s, db.Pool, in)
			require.NoError(t, err)
		}
		got, err := s.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Len(t, got.History, 20)
		require.Equal(t, "boom 5", got.History[0].Error, "the oldest five went")
		require.Equal(t, "boom 24", got.History[19].Error)
		require.Equal(t, 25, got.History[19].Attempts)
		require.False(t, got.History[19].At.IsZero())
		peek, err := s.Peek(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, got.History, peek.History)
		brief, err := s.List(ctx, db.Pool, &deadletter.ListOpts{Brief: true})
		require.NoError(t, err)
		require.Empty(t, brief[0].History, "a brief listing reads no history")
	})

	t.Run("GetUnknownIsNotFound", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		_, err := s.Get(ctx, db.Pool, 42)
		require.ErrorIs(t, err, outbox.ErrNotFound)
		require.ErrorContains(t, err, "deadletter: letter 42: outbox: not found")
	})

	t.Run("PutDefaultsTheReasonAndRefusesAnUnknownOne", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		id, err := put(ctx, s, db.Pool, letter("svc", "orders", 1, "o-1"))
		require.NoError(t, err)
		got, err := s.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, deadletter.ReasonHandler, got.Reason)
		l := letter("svc", "orders", 2, "o-2")
		l.Reason = "broken"
		_, err = put(ctx, s, db.Pool, l)
		require.ErrorContains(t, err, `unknown reason "broken"`)
	})

	t.Run("ListFilters", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		for i, l := range []*deadletter.Letter{
			letter("svc", "orders", 1, "o-1"),
			letter("svc", "orders", 2, "o-2"),
			letter("svc", "invoices", 3, "o-1"),
			letter("other", "orders", 4, "o-1"),
		} {
			_, err := put(ctx, s, db.Pool, l)
			require.NoError(t, err, i)
		}
		list := func(o *deadletter.ListOpts) []int64 {
			ls, err := s.List(ctx, db.Pool, o)
			require.NoError(t, err)
			var offs []int64
			for _, l := range ls {
				offs = append(offs, l.Record.Offset)
			}
			return offs
		}
		require.Equal(t, []int64{1, 2, 3, 4}, list(nil))
		require.Equal(t, []int64{1, 2, 3}, list(&deadletter.ListOpts{Consumer: "svc"}))
		require.Equal(t, []int64{1, 2}, list(&deadletter.ListOpts{Consumer: "svc", Topic: "orders"}))
		require.Equal(t, []int64{1, 3, 4}, list(&deadletter.ListOpts{AggregateType: "order", AggregateID: "o-1"}))
		require.Equal(t, []int64{1}, list(&deadletter.ListOpts{Limit: 1}))
		all, err := s.List(ctx, db.Pool, nil)
		require.NoError(t, err)
		require.Equal(t, []int64{3, 4}, list(&deadletter.ListOpts{AfterID: all[1].ID}))
		require.NoError(t, s.Discard(ctx, db.Pool, all[0].ID, nil))
		require.Equal(t, []int64{2, 3, 4}, list(&deadletter.ListOpts{Status: deadletter.StatusDead}))
		require.Equal(t, []int64{1}, list(&deadletter.ListOpts{Status: deadletter.StatusDiscarded}))
	})

	t.Run("ReplayMarksReplayedOnceAndOnlyOnSuccess", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		id, err := put(ctx, s, db.Pool, letter("svc", "orders", 1, "o-1"))
		require.NoError(t, err)
		boom := errors.New("still broken")
		err = s.Replay(ctx, db.Pool, id, func(context.Context, pgx.Tx, *deadletter.Letter) error { return boom })
		require.ErrorIs(t, err, boom)
		got, err := s.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, deadletter.StatusDead, got.Status)

		calls := 0
		err = s.Replay(ctx, db.Pool, id, func(_ context.Context, _ pgx.Tx, l *deadletter.Letter) error {
			calls++
			require.Equal(t, id, l.ID)
			return nil
		})
		require.NoError(t, err)
		got, err = s.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, deadletter.StatusReplayed, got.Status)
		require.NotNil(t, got.ResolvedAt)

		err = s.Replay(ctx, db.Pool, id, func(context.Context, pgx.Tx, *deadletter.Letter) error { calls++; return nil })
		require.ErrorIs(t, err, deadletter.ErrResolved)
		require.ErrorIs(t, s.Discard(ctx, db.Pool, id, nil), deadletter.ErrResolved)
		require.Equal(t, 1, calls)
	})

	// Two replays of one letter at once: the second waits for the first's
	// row lock and then finds the letter resolved, so the work runs once.
	t.Run("ConcurrentReplaysRunOnce", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		id, err := put(ctx, s, db.Pool, letter("svc", "orders", 1, "o-1"))
		require.NoError(t, err)
		inside := make(chan struct{})
		release := make(chan struct{})
		first := make(chan error, 1)
		go func() {
			first <- s.Replay(ctx, db.Pool, id, func(context.Context, pgx.Tx, *deadletter.Letter) error {
				close(inside)
				<-release
				return nil
			})
		}()
		<-inside
		second := make(chan error, 1)
		go func() {
			second <- s.Replay(ctx, db.Pool, id, func(context.Context, pgx.Tx, *deadletter.Letter) error {
				return errors.New("ran twice")
			})
		}()
		close(release)
		require.NoError(t, <-first)
		require.ErrorIs(t, <-second, deadletter.ErrResolved)
	})
}

// put stores l in a transaction of its own.
func put(ctx context.Context, s *letters.Store, db *pgxpool.Pool, l *deadletter.Letter) (id int64, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		id, err = s.Put(ctx, tx, l)
		return err
	})
	return id, err
}
