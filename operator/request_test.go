package operator_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/eventually"
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
		"UnknownReason":       {Consumer: "svc", Action: operator.Replay, Letters: deadletter.ListOpts{Reason: "handlr"}},
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
	require.Equal(t, deadletter.ReasonInput, r.Letters.Reason)
	require.True(t, after.Equal(r.Letters.FailedAfter))
	require.InDelta(t, 5, r.Rate, 0)
	require.Nil(t, r.StartedAt)

	es, err := ops.Audit(ctx, db.Pool, &operator.AuditOpts{RequestID: id})
	require.NoError(t, err)
	require.Len(t, es, 1)
	require.Equal(t, operator.OutcomeRequested, es[0].Outcome)
	require.Equal(t, `letters topic="orders" reason="input" failed_after=2026-01-02T03:04:05Z at 5/s`, es[0].Detail)

	_, err = ops.Get(ctx, db.Pool, id+100)
	require.ErrorIs(t, err, outbox.ErrNotFound)

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
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return ops.Count(ctx, tx, r, operator.Progress{Applied: 3}) }))
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

func TestSubmitRate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	ops := operator.New(&operator.Config{Schema: db.Schema})
	for _, tc := range []struct {
		name string
		rate float64
		ok   bool
	}{
		{"NoBound", 0, true},
		{"Min", operator.MinRate, true},
		{"One", 1, true},
		{"Max", operator.MaxRate, true},
		// 1e-10 made the pause between letters overflow into none at all.
		{"Tiny", 1e-10, false},
		{"BelowMin", operator.MinRate / 2, false},
		{"AboveMax", operator.MaxRate * 2, false},
		{"Negative", -1, false},
		{"NaN", math.NaN(), false},
		{"Inf", math.Inf(1), false},
		{"NegativeInf", math.Inf(-1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ops.Submit(ctx, db.Pool, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true, Rate: tc.rate})
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, operator.ErrInvalid)
			require.ErrorContains(t, err, "Rate")
			require.ErrorContains(t, err, "want 0 (no bound) or 0.001 to 10000")
		})
	}
}

func TestFencing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*operator.Store, *pgtest.DB, int64) {
		t.Helper()
		db := pgtest.New(t, nil)
		ops := operator.New(&operator.Config{Schema: db.Schema})
		id, err := ops.Submit(ctx, db.Pool, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true})
		require.NoError(t, err)
		return ops, db, id
	}
	count := func(t *testing.T, ops *operator.Store, db *pgtest.DB, r *operator.Request, delta operator.Progress) error {
		t.Helper()
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return ops.Count(ctx, tx, r, delta) })
	}

	t.Run("ATakeoverFencesOutTheFirstClaim", func(t *testing.T) {
		t.Parallel()
		ops, db, id := setup(t)
		first, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		require.EqualValues(t, 1, first.Claim)
		require.NoError(t, count(t, ops, db, first, operator.Progress{Applied: 1, Drained: 2}))
		require.Equal(t, operator.Progress{Applied: 1, Drained: 2}, first.Progress)
		require.NoError(t, ops.Renew(ctx, db.Pool, first, -time.Second)) // it stalls: its lease runs out

		second, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		require.Equal(t, id, second.ID)
		require.EqualValues(t, 2, second.Claim)
		require.Equal(t, operator.Progress{Applied: 1, Drained: 2}, second.Progress, "what the first did is kept")

		// Every write of the first now touches nothing.
		first.Progress.Failed, first.Error = 7, "stale"
		require.ErrorIs(t, ops.Renew(ctx, db.Pool, first, time.Hour), operator.ErrClaimLost)
		require.ErrorIs(t, count(t, ops, db, first, operator.Progress{Applied: 1}), operator.ErrClaimLost)
		require.ErrorIs(t, ops.Report(ctx, db.Pool, first, time.Hour), operator.ErrClaimLost)
		require.ErrorIs(t, ops.Finish(ctx, db.Pool, first, true), operator.ErrClaimLost)

		require.NoError(t, count(t, ops, db, second, operator.Progress{Duplicates: 1}))
		second.Progress.Matched = 2
		require.NoError(t, ops.Finish(ctx, db.Pool, second, false))
		got, err := ops.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, operator.Done, got.Status)
		require.Equal(t, operator.Progress{Matched: 2, Applied: 1, Duplicates: 1, Drained: 2}, got.Progress)
		require.Empty(t, got.Error)
		require.ErrorIs(t, ops.Renew(ctx, db.Pool, second, time.Hour), operator.ErrClaimLost, "a finished request has no lease")
	})

	t.Run("ACountRolledBackWithItsActionCountsNothing", func(t *testing.T) {
		t.Parallel()
		ops, db, id := setup(t)
		r, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, ops.Count(ctx, tx, r, operator.Progress{Applied: 1}))
		require.NoError(t, tx.Rollback(ctx))
		got, err := ops.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Zero(t, got.Progress.Applied)
	})

	t.Run("AGivenUpRequestIsClaimedAgainAtOnce", func(t *testing.T) {
		t.Parallel()
		ops, db, id := setup(t)
		r, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		require.NoError(t, ops.Report(ctx, db.Pool, r, 0))
		again, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		require.NotNil(t, again)
		require.Equal(t, id, again.ID)
	})
}

func TestCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*operator.Store, *pgtest.DB, int64) {
		t.Helper()
		db := pgtest.New(t, nil)
		ops := operator.New(&operator.Config{Schema: db.Schema})
		id, err := ops.Submit(ctx, db.Pool, &operator.Request{Consumer: "svc", Action: operator.Discard, All: true})
		require.NoError(t, err)
		return ops, db, id
	}

	t.Run("APendingRequestIsNeverClaimed", func(t *testing.T) {
		t.Parallel()
		ops, db, id := setup(t)
		r, err := ops.Cancel(operator.WithActor(ctx, "dave"), db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, operator.Cancelled, r.Status)
		require.True(t, r.Finished())
		require.NotNil(t, r.FinishedAt)
		none, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		require.Nil(t, none)
		es, err := ops.Audit(ctx, db.Pool, &operator.AuditOpts{RequestID: id})
		require.NoError(t, err)
		require.Len(t, es, 2)
		require.Equal(t, operator.Entry{ID: es[0].ID, At: es[0].At, Actor: "dave", Consumer: "svc", Action: operator.Discard, RequestID: id,
			Outcome: operator.OutcomeCancelled, Detail: "was pending"}, es[0])
	})

	t.Run("ARunningRequestsCarrierIsStopped", func(t *testing.T) {
		t.Parallel()
		ops, db, id := setup(t)
		r, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		// An action counted before the cancel: Cancel waits for it to
		// commit, and it stays counted.
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, ops.Count(ctx, tx, r, operator.Progress{Discarded: 1, Drained: 1}))
		cancelled := make(chan *operator.Request, 1)
		go func() {
			c, err := ops.Cancel(ctx, db.Pool, id)
			assertNoError(t, err)
			cancelled <- c
		}()
		waitForLock(t, db)
		require.NoError(t, tx.Commit(ctx))
		c := <-cancelled
		require.Equal(t, operator.Cancelled, c.Status)
		require.Equal(t, operator.Progress{Discarded: 1, Drained: 1}, c.Progress)

		// The carrier's next renewal or count says so; its Finish keeps
		// the request cancelled and adds its run's counts.
		require.ErrorIs(t, ops.Renew(ctx, db.Pool, r, time.Hour), operator.ErrCancelled)
		require.ErrorIs(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return ops.Count(ctx, tx, r, operator.Progress{Discarded: 1})
		}), operator.ErrCancelled)
		r.Progress.Matched, r.Progress.Skipped = 3, 1
		require.NoError(t, ops.Finish(ctx, db.Pool, r, false))
		require.Equal(t, operator.Cancelled, r.Status)
		got, err := ops.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, operator.Cancelled, got.Status)
		require.Equal(t, operator.Progress{Matched: 3, Discarded: 1, Skipped: 1, Drained: 1}, got.Progress)
		es, err := ops.Audit(ctx, db.Pool, &operator.AuditOpts{RequestID: id})
		require.NoError(t, err)
		require.Equal(t, "was running", es[0].Detail)
	})

	t.Run("AFinishedOrUnknownRequestIsRefused", func(t *testing.T) {
		t.Parallel()
		ops, db, id := setup(t)
		r, err := ops.Claim(ctx, db.Pool, "svc", time.Hour)
		require.NoError(t, err)
		require.NoError(t, ops.Finish(ctx, db.Pool, r, false))
		_, err = ops.Cancel(ctx, db.Pool, id)
		require.ErrorIs(t, err, operator.ErrFinished)
		require.ErrorContains(t, err, "is done already")
		_, err = ops.Cancel(ctx, db.Pool, id+100)
		require.ErrorIs(t, err, outbox.ErrNotFound)
		got, err := ops.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, operator.Done, got.Status)
	})
}

// waitForLock waits until a statement on db's schema waits for a lock.
func waitForLock(t *testing.T, db *pgtest.DB) {
	t.Helper()
	eventually.True(t, 10*time.Second, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, db.Schema).Scan(&n))
		return n > 0
	}, "a statement on %s waits for a lock", db.Schema)
}
