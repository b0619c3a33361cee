package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/operator"
)

// serve runs p.ServeRequests until the test ends.
func serve(t *testing.T, p *consumer.Processor) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.ServeRequests(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
}

// submitAndWait submits r and waits, at most 20 s, for it to finish.
func submitAndWait(t *testing.T, db *pgtest.DB, r *operator.Request) *operator.Request {
	t.Helper()
	ops := operator.New(&operator.Config{Schema: db.Schema})
	ctx, cancel := context.WithTimeout(operator.WithActor(context.Background(), "alice"), 20*time.Second)
	defer cancel()
	id, err := ops.Submit(ctx, db.Pool, r)
	require.NoError(t, err)
	got, err := ops.Wait(ctx, db.Pool, id, 20*time.Millisecond)
	require.NoError(t, err)
	return got
}

func audit(t *testing.T, db *pgtest.DB, req int64) []operator.Entry {
	t.Helper()
	es, err := operator.New(&operator.Config{Schema: db.Schema}).Audit(context.Background(), db.Pool, &operator.AuditOpts{RequestID: req})
	require.NoError(t, err)
	return es
}

func TestRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*consumer.Processor, *effects, *pgtest.DB) {
		t.Helper()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		cfg := fastConfig(db, 1)
		cfg.RequestPoll = 20 * time.Millisecond
		p, err := consumer.Handle(db.Pool, "svc", e, cfg)
		require.NoError(t, err)
		serve(t, p)
		return p, e, db
	}
	open := func(t *testing.T, p *consumer.Processor, agg string) []*deadletter.Letter {
		t.Helper()
		ls, err := p.DeadLetters(ctx, &deadletter.ListOpts{Status: deadletter.StatusDead, AggregateID: agg})
		require.NoError(t, err)
		return ls
	}

	t.Run("ReplayOneLetterDrainsItsSuccessors", func(t *testing.T) {
		t.Parallel()
		p, e, db := setup(t)
		e.setFail("a", errBroken)
		processAll(t, p, 1, rec("a", 1, "a1"), rec("a", 2, "a2"), rec("a", 3, "a3"))
		letters := open(t, p, "a")
		require.Len(t, letters, 1)
		e.setFail("a", nil)

		r := submitAndWait(t, db, &operator.Request{Consumer: "svc", Action: operator.Replay, LetterID: letters[0].ID})
		require.Equal(t, operator.Done, r.Status, r.Error)
		require.Equal(t, operator.Progress{Matched: 1, Applied: 1, Drained: 2}, r.Progress)
		require.Equal(t, "alice", r.RequestedBy)
		require.Equal(t, []int64{1, 2, 3}, e.seqs(t, "a"))
		require.Empty(t, open(t, p, "a"))

		es := audit(t, db, r.ID)
		require.Len(t, es, 2)
		require.Equal(t, "applied", es[0].Outcome)
		require.Equal(t, "alice", es[0].Actor)
		require.Equal(t, letters[0].ID, es[0].LetterID)
		require.Equal(t, "a", es[0].AggregateID)
		require.Equal(t, "drained 2", es[0].Detail)
		require.Equal(t, "requested", es[1].Outcome)
	})

	t.Run("AFailedReplayFailsTheRequestAndChangesNothing", func(t *testing.T) {
		t.Parallel()
		p, e, db := setup(t)
		e.setFail("a", errBroken)
		processAll(t, p, 1, rec("a", 1, "a1"), rec("a", 2, "a2"))
		letters := open(t, p, "a")

		r := submitAndWait(t, db, &operator.Request{Consumer: "svc", Action: operator.Replay, LetterID: letters[0].ID})
		require.Equal(t, operator.Failed, r.Status)
		require.Contains(t, r.Error, errBroken.Error())
		require.Equal(t, operator.Progress{Matched: 1, Failed: 1}, r.Progress)
		require.Empty(t, e.seqs(t, "a"))
		require.Len(t, open(t, p, "a"), 1)
		es := audit(t, db, r.ID)
		require.Equal(t, "failed", es[0].Outcome)
		require.Contains(t, es[0].Detail, errBroken.Error())
	})

	t.Run("BulkReplayKeepsOrderAndStopsAFailingAggregate", func(t *testing.T) {
		t.Parallel()
		p, e, db := setup(t)
		// a: a letter at 2, parked 3 to 6 behind it (5 will fail). b: a
		// letter at 1 that keeps failing the first time, parked 2 and 3.
		e.failKey("a2", errBroken)
		e.failKey("a5", errBroken)
		e.failKey("b1", errBroken)
		e.failKey("b3", errBroken)
		processAll(t, p, 1, rec("a", 1, "a1"), rec("a", 2, "a2"), rec("a", 3, "a3"), rec("a", 4, "a4"),
			rec("b", 1, "b1"), rec("b", 2, "b2"), rec("b", 3, "b3"))
		// a5 arrives while a's position is at 1: it parks; its letter comes
		// once the replay of a2 drains it and it fails there.
		processAll(t, p, 1, rec("a", 5, "a5"), rec("a", 6, "a6"))
		require.Len(t, open(t, p, "a"), 1)
		e.failKey("a2", nil)
		e.failKey("b3", nil)

		preview, err := deadletter.New(&deadletter.Config{Schema: db.Schema}).Preview(ctx, db.Pool,
			&deadletter.ListOpts{Consumer: "svc", Status: deadletter.StatusDead})
		require.NoError(t, err)
		require.Equal(t, deadletter.Preview{Letters: 2, Aggregates: 2, Parked: 6}, preview)

		r := submitAndWait(t, db, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true, Rate: 1000})
		require.Equal(t, operator.Done, r.Status, r.Error)
		// a2 applied, draining 3 and 4; a5 failed in that drain and is a
		// letter now, not in this request's match. b1 failed: b stops.
		require.Equal(t, operator.Progress{Matched: 2, Applied: 1, Failed: 1, Drained: 2}, r.Progress)
		require.Contains(t, r.Error, errBroken.Error())
		require.Equal(t, []int64{1, 2, 3, 4}, e.seqs(t, "a"))
		require.Empty(t, e.seqs(t, "b"))

		// Fix a5 and b1: the second bulk request replays a5 (draining a6),
		// then b1 (draining b2 and b3, parked untried).
		e.failKey("a5", nil)
		e.failKey("b1", nil)
		r = submitAndWait(t, db, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true})
		require.Equal(t, operator.Done, r.Status, r.Error)
		require.Equal(t, operator.Progress{Matched: 2, Applied: 2, Drained: 3}, r.Progress)
		require.Equal(t, []int64{1, 2, 3, 4, 5, 6}, e.seqs(t, "a"))
		require.Equal(t, []int64{1, 2, 3}, e.seqs(t, "b"))
		rows, distinct := e.count(t)
		require.Equal(t, rows, distinct)
	})

	t.Run("BulkDiscardByFilterReleasesSuccessorsOfThoseOnly", func(t *testing.T) {
		t.Parallel()
		p, e, db := setup(t)
		e.setFail("a", consumer.Permanent(errBroken))
		e.setFail("b", consumer.Permanent(errBroken))
		processAll(t, p, 1, rec("a", 1, "a1"), rec("b", 1, "b1"))
		e.setFail("a", nil)
		e.setFail("b", nil)
		processAll(t, p, 1, rec("a", 2, "a2"), rec("b", 2, "b2"))

		r := submitAndWait(t, db, &operator.Request{Consumer: "svc", Action: operator.Discard,
			Letters: deadletter.ListOpts{AggregateID: "a", Reason: "handler"}})
		require.Equal(t, operator.Done, r.Status, r.Error)
		require.Equal(t, operator.Progress{Matched: 1, Discarded: 1, Drained: 1}, r.Progress)
		require.Equal(t, []int64{2}, e.seqs(t, "a"))
		require.Empty(t, e.seqs(t, "b"))
		require.Len(t, open(t, p, "b"), 1)
	})

	t.Run("ResolveGap", func(t *testing.T) {
		t.Parallel()
		p, e, db := setup(t)
		processAll(t, p, 1, rec("a", 1, "a1"), rec("a", 3, "a3"), rec("a", 4, "a4"))
		r := submitAndWait(t, db, &operator.Request{Consumer: "svc", Action: operator.ResolveGap,
			Letters: deadletter.ListOpts{AggregateType: "order", AggregateID: "a"}})
		require.Equal(t, operator.Done, r.Status, r.Error)
		require.EqualValues(t, 2, r.Progress.Drained)
		require.Equal(t, []int64{1, 3, 4}, e.seqs(t, "a"))
		es := audit(t, db, r.ID)
		require.Equal(t, "resolved", es[0].Outcome)
		require.Equal(t, "skipped 2..2, drained 2", es[0].Detail)

		r = submitAndWait(t, db, &operator.Request{Consumer: "svc", Action: operator.ResolveGap,
			Letters: deadletter.ListOpts{AggregateType: "order", AggregateID: "a"}})
		require.Equal(t, operator.Failed, r.Status)
		require.Contains(t, r.Error, consumer.ErrNoGap.Error())
	})

	t.Run("ANotificationWakesTheServerBeforeItsPoll", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		cfg := fastConfig(db, 1)
		cfg.RequestPoll = time.Hour
		p, err := consumer.Handle(db.Pool, "svc", e, cfg)
		require.NoError(t, err)
		e.setFail("a", consumer.Permanent(errBroken))
		processAll(t, p, 1, rec("a", 1, "a1"))
		e.setFail("a", nil)
		serve(t, p)
		channel := operator.Channel(db.Schema)
		eventually.True(t, 10*time.Second, func() bool {
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN ' || $1`, channel).Scan(&n))
			return n == 1
		}, "the server listens on %s", channel)

		r := submitAndWait(t, db, &operator.Request{Consumer: "svc", Action: operator.Replay, LetterID: open(t, p, "a")[0].ID})
		require.Equal(t, operator.Done, r.Status, r.Error)
		require.Equal(t, []int64{1}, e.seqs(t, "a"))
	})

	t.Run("DirectCallsAreAudited", func(t *testing.T) {
		t.Parallel()
		p, e, db := setup(t)
		e.setFail("a", consumer.Permanent(errBroken))
		processAll(t, p, 1, rec("a", 1, "a1"))
		letters := open(t, p, "a")
		_, err := p.Discard(operator.WithActor(ctx, "bob"), letters[0].ID)
		require.NoError(t, err)
		es := audit(t, db, 0)
		require.Len(t, es, 1)
		require.Equal(t, operator.Entry{ID: es[0].ID, At: es[0].At, Actor: "bob", Consumer: "svc", Action: operator.Discard,
			LetterID: letters[0].ID, AggregateType: "order", AggregateID: "a", Outcome: "discarded", Detail: "drained 0"}, es[0])
	})
}
