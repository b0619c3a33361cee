package operator_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/operator"
)

func TestSubmit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	ops := operator.New(&operator.Config{Schema: db.Schema})

	for name, r := range map[string]*operator.Request{
		"NoConsumer":          {Action: operator.Replay, LetterID: 1},
		"UnknownAction":       {Consumer: "svc", Action: "redo", LetterID: 1},
		"BulkWithoutFilter":   {Consumer: "svc", Action: operator.Discard},
		"GapWithoutAggregate": {Consumer: "svc", Action: operator.ResolveGap},
		"NegativeRate":        {Consumer: "svc", Action: operator.Replay, All: true, Rate: -1},
	} {
		_, err := ops.Submit(ctx, db.Pool, r)
		require.ErrorIs(t, err, operator.ErrInvalid, name)
	}

	after := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	id, err := ops.Submit(operator.WithActor(ctx, "carol"), db.Pool, &operator.Request{Consumer: "svc", Action: operator.Discard, Rate: 5,
		Letters: deadletter.ListOpts{Topic: "orders", Reason: "input", FailedAfter: after}})
	require.NoError(t, err)
	r, err := ops.Get(ctx, db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, operator.Pending, r.Status)
	require.Equal(t, "carol", r.RequestedBy)
	require.Equal(t, "orders", r.Letters.Topic)
	require.Equal(t, "input", r.Letters.Reason)
	require.True(t, after.Equal(r.Letters.FailedAfter))
	require.InDelta(t, 5, r.Rate, 0)
	require.Nil(t, r.StartedAt)

	es, err := ops.Audit(ctx, db.Pool, &operator.AuditOpts{RequestID: id})
	require.NoError(t, err)
	require.Len(t, es, 1)
	require.Equal(t, "requested", es[0].Outcome)
	require.Equal(t, `letters topic="orders" reason="input" failed_after=2026-01-02T03:04:05Z at 5/s`, es[0].Detail)

	_, err = ops.Get(ctx, db.Pool, id+100)
	require.ErrorIs(t, err, operator.ErrNotFound)

	list, err := ops.List(ctx, db.Pool, &operator.ListOpts{Consumer: "svc", Status: operator.Pending})
	require.NoError(t, err)
	require.Len(t, list, 1)
	list, err = ops.List(ctx, db.Pool, &operator.ListOpts{Consumer: "other"})
	require.NoError(t, err)
	require.Empty(t, list)
}

func TestSubmitNotifiesTheConsumersChannel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db := pgtest.New(t, nil)
	ops := operator.New(&operator.Config{Schema: db.Schema})
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{ops.Channel()}.Sanitize())
	require.NoError(t, err)

	_, err = ops.Submit(ctx, db.Pool, &operator.Request{Consumer: "svc", Action: operator.Replay, LetterID: 7})
	require.NoError(t, err)
	n, err := conn.Conn().WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, "svc", n.Payload)
	require.NotEqual(t, operator.Channel("other"), ops.Channel())
}

func TestClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("OldestFirstAndNeverTwice", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		ops := operator.New(&operator.Config{Schema: db.Schema})
		const n = 20
		for i := range n {
			_, err := ops.Submit(ctx, db.Pool, &operator.Request{Consumer: "svc", Action: operator.Replay, LetterID: int64(i + 1)})
			require.NoError(t, err)
		}
		_, err := ops.Submit(ctx, db.Pool, &operator.Request{Consumer: "other", Action: operator.Replay, LetterID: 1})
		require.NoError(t, err)

		var (
			mu      sync.Mutex
			claimed []int64
			wg      sync.WaitGroup
		)
		for range 4 {
			wg.Go(func() {
				for {
					r, err := ops.Claim(ctx, db.Pool, "svc", time.Minute)
					if !assertNoError(t, err) || r == nil {
						return
					}
					mu.Lock()
					claimed = append(claimed, r.LetterID)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		require.ElementsMatch(t, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, claimed)

		r, err := ops.Claim(ctx, db.Pool, "other", time.Minute)
		require.NoError(t, err)
		require.Equal(t, operator.Running, r.Status)
		require.NotNil(t, r.StartedAt)
	})

	t.Run("ALapsedLeaseIsTakenUpAgainWithItsProgress", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		ops := operator.New(&operator.Config{Schema: db.Schema})
		id, err := ops.Submit(ctx, db.Pool, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true})
		require.NoError(t, err)
		r, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		r.Progress.Applied = 3
		require.NoError(t, ops.Report(ctx, db.Pool, r, time.Hour))
		again, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		require.Nil(t, again, "held under a live lease")

		// The process dies: its lease runs out instead of being renewed.
		require.NoError(t, ops.Report(ctx, db.Pool, r, -time.Second))
		again, err = ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		require.NotNil(t, again)
		require.Equal(t, id, again.ID)
		require.EqualValues(t, 3, again.Progress.Applied)

		again.Error = "boom"
		require.NoError(t, ops.Finish(ctx, db.Pool, again, true))
		got, err := ops.Wait(ctx, db.Pool, id, time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, operator.Failed, got.Status)
		require.Equal(t, "boom", got.Error)
		require.NotNil(t, got.FinishedAt)
		none, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		require.Nil(t, none)
	})

	t.Run("WaitEndsWithItsContext", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		ops := operator.New(&operator.Config{Schema: db.Schema})
		id, err := ops.Submit(ctx, db.Pool, &operator.Request{Consumer: "svc", Action: operator.Replay, LetterID: 1})
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		r, err := ops.Wait(wctx, db.Pool, id, 10*time.Millisecond)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, operator.Pending, r.Status)
	})
}

// assertNoError is require.NoError for a goroutine other than the test's.
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
