package consumer_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
		require.NoError(t, <-done)
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
		ls, err := lettersOf(ctx, p, &deadletter.ListOpts{Status: deadletter.StatusDead, AggregateID: agg})
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
		require.Equal(t, operator.OutcomeApplied, es[0].Outcome)
		require.Equal(t, "alice", es[0].Actor)
		require.Equal(t, letters[0].ID, es[0].LetterID)
		require.Equal(t, "a", es[0].AggregateID)
		require.Equal(t, "drained 2", es[0].Detail)
		require.Equal(t, operator.OutcomeRequested, es[1].Outcome)
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
		require.Equal(t, operator.OutcomeFailed, es[0].Outcome)
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

		preview, err := p.Inspector().PreviewLetters(ctx,
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
		require.Equal(t, operator.OutcomeResolved, es[0].Outcome)
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
			LetterID: letters[0].ID, AggregateType: "order", AggregateID: "a", Outcome: operator.OutcomeDiscarded, Detail: "drained 0"}, es[0])
	})
}

// gate blocks the handler at the first record of one key until released
// (or, when it heeds its ctx, until the handler's ctx ends), and then runs
// next. It records the server pid of the transaction it blocks.
type gate struct {
	next      consumer.Handler
	key       string
	heedCtx   bool
	entered   chan struct{}
	release   chan struct{}
	returned  chan struct{}
	blocked   atomic.Bool
	pid       atomic.Uint32
	closeOnce sync.Once
}

func newGate(next consumer.Handler, key string, heedCtx bool) *gate {
	return &gate{next: next, key: key, heedCtx: heedCtx, entered: make(chan struct{}), release: make(chan struct{}), returned: make(chan struct{})}
}

func (g *gate) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if m.IdempotencyKey == g.key && g.blocked.CompareAndSwap(false, true) {
		var pid uint32
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		g.pid.Store(pid)
		close(g.entered)
		defer close(g.returned)
		if g.heedCtx {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-g.release:
			}
		} else {
			<-g.release
		}
	}
	return g.next.Handle(ctx, tx, m)
}

// open releases the gate; it may be called more than once.
func (g *gate) open() { g.closeOnce.Do(func() { close(g.release) }) }

// stall is a heartbeat hook that blocks every renewal until released or
// until the heartbeat's ctx ends: a process paused as a whole.
type stall struct {
	release   chan struct{}
	closeOnce sync.Once
}

func newStall() *stall { return &stall{release: make(chan struct{})} }

func (s *stall) beat(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-s.release:
	}
}

func (s *stall) open() { s.closeOnce.Do(func() { close(s.release) }) }

// requestRow is what the test reads of request id straight from its row.
func requestRow(t *testing.T, db *pgtest.DB, id int64) *operator.Request {
	t.Helper()
	r, err := operator.New(&operator.Config{Schema: db.Schema}).Get(context.Background(), db.Pool, id)
	require.NoError(t, err)
	return r
}

// leaseRunOut waits until request id's lease has run out.
func leaseRunOut(t *testing.T, db *pgtest.DB, id int64) {
	t.Helper()
	eventually.True(t, 20*time.Second, func() bool {
		var out bool
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT lease_until < now() FROM `+db.Table("operator_requests")+` WHERE id = $1`, id).Scan(&out))
		return out
	}, "the lease of request %d runs out", id)
}

// auditOutcomes counts request id's audit rows by outcome.
func auditOutcomes(t *testing.T, db *pgtest.DB, id int64) map[operator.Outcome]int {
	t.Helper()
	n := map[operator.Outcome]int{}
	for _, e := range audit(t, db, id) {
		n[e.Outcome]++
	}
	return n
}

// TestRequestClaims: the lease of a request is renewed by a heartbeat
// while it is carried out, every write of it is fenced by the claim, and
// what it did is counted exactly whoever carries it to its end.
func TestRequestClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// lease is short, so that a stalled or dead process's lease runs out
	// soon. heartbeatLease is for the tests whose first process must keep
	// its lease throughout: it renews every third of a lease, and on a
	// loaded machine a renewal can come 200 ms late, which would let a
	// 300 ms lease lapse and the second process take the request up.
	const lease, heartbeatLease = 300 * time.Millisecond, time.Second
	type bundle struct {
		db    *pgtest.DB
		e     *effects
		lease time.Duration
	}
	setup := func(t *testing.T, aggs ...string) *bundle {
		t.Helper()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		p, err := consumer.Handle(db.Pool, "svc", e, fastConfig(db, 1))
		require.NoError(t, err)
		for _, agg := range aggs {
			e.setFail(agg, consumer.Permanent(errBroken))
			processAll(t, p, 1, rec(agg, 1, agg+"1"))
			e.setFail(agg, nil)
		}
		return &bundle{db: db, e: e, lease: lease}
	}
	// processor is a process of consumer svc with handler h, claiming
	// under lease with beat before each renewal; its log goes to log.
	processor := func(t *testing.T, b *bundle, h consumer.Handler, beat func(context.Context), log *lockedBuffer) *consumer.Processor {
		t.Helper()
		cfg := fastConfig(b.db, 1)
		cfg.RequestPoll = 20 * time.Millisecond
		if log != nil {
			cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
		}
		p, err := consumer.Handle(b.db.Pool, "svc", h, cfg)
		require.NoError(t, err)
		consumer.SetRequestLease(p, b.lease, beat)
		return p
	}
	submit := func(t *testing.T, b *bundle, r *operator.Request) int64 {
		t.Helper()
		id, err := operator.New(&operator.Config{Schema: b.db.Schema}).Submit(ctx, b.db.Pool, r)
		require.NoError(t, err)
		return id
	}
	wait := func(t *testing.T, b *bundle, id int64) *operator.Request {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		r, err := operator.New(&operator.Config{Schema: b.db.Schema}).Wait(wctx, b.db.Pool, id, 10*time.Millisecond)
		require.NoError(t, err)
		return r
	}
	// serveOne runs consumer.ServeOne in the background; its result
	// comes on the channel.
	serveOne := func(p *consumer.Processor) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := consumer.ServeOne(p, ctx)
			done <- err
		}()
		return done
	}

	t.Run("TheHeartbeatKeepsTheLeaseThroughALongAction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "a")
		b.lease = heartbeatLease
		g := newGate(b.e, "a1", false)
		first := processor(t, b, g, nil, nil)
		t.Cleanup(g.open)
		id := submit(t, b, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true})
		done := serveOne(first)
		<-g.entered
		// A second process looks for requests all along; the first's
		// action lasts many leases.
		serve(t, processor(t, b, b.e, nil, nil))
		started := requestRow(t, b.db, id).StartedAt
		eventually.True(t, 20*time.Second, func() bool { return time.Since(*started) > 5*b.lease }, "five leases pass")
		var live bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT lease_until > now() FROM `+b.db.Table("operator_requests")+` WHERE id = $1`, id).Scan(&live))
		require.True(t, live, "the lease was renewed while the action ran")
		g.open()
		require.NoError(t, <-done)
		r := wait(t, b, id)
		require.Equal(t, operator.Done, r.Status, r.Error)
		require.EqualValues(t, 1, r.Claim, "nobody else took it up")
		require.Equal(t, operator.Progress{Matched: 1, Applied: 1}, r.Progress)
		require.Equal(t, 2, b.e.callsOf("a1"), "once failing, once replayed")
	})

	t.Run("TheHeartbeatKeepsTheLeaseThroughRatesPause", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "a", "b")
		b.lease = heartbeatLease
		first := processor(t, b, b.e, nil, nil)
		// Two letters at 0.25 a second: a pause of 4 s, four leases.
		id := submit(t, b, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true, Rate: 0.25})
		done := serveOne(first)
		// The second process starts once the first holds the request, so
		// that only a lapsed lease could let it take the request up.
		eventually.True(t, 20*time.Second, func() bool { return requestRow(t, b.db, id).Status == operator.Running },
			"the first process claimed the request")
		serve(t, processor(t, b, b.e, nil, nil))
		require.NoError(t, <-done)
		r := requestRow(t, b.db, id)
		require.Equal(t, operator.Done, r.Status, r.Error)
		require.EqualValues(t, 1, r.Claim, "nobody else took it up")
		require.Equal(t, operator.Progress{Matched: 2, Applied: 2}, r.Progress)
		require.Equal(t, 2, b.e.callsOf("a1"), "once failing, once replayed")
		require.Equal(t, 2, b.e.callsOf("b1"), "once failing, once replayed")
	})

	t.Run("AProcessThatStalledPastItsLeaseWritesNothingAfterATakeover", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "a", "b", "c")
		g, st, log := newGate(b.e, "b1", false), newStall(), &lockedBuffer{}
		first := processor(t, b, g, st.beat, log)
		t.Cleanup(func() { g.open(); st.open() })
		id := submit(t, b, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true})
		done := serveOne(first)
		// The first process applies a1, then stalls as a whole inside
		// the action of b1, past its lease.
		<-g.entered
		leaseRunOut(t, b.db, id)
		serve(t, processor(t, b, b.e, nil, nil))
		eventually.True(t, 20*time.Second, func() bool { return requestRow(t, b.db, id).Claim == 2 }, "the second process takes the request up")
		// The second waits for b1's letter, which the first's transaction
		// holds; the first wakes up and must not commit it.
		g.open()
		st.open()
		require.NoError(t, <-done)
		r := wait(t, b, id)
		require.Equal(t, operator.Done, r.Status, r.Error)
		require.EqualValues(t, 2, r.Claim)
		require.Equal(t, operator.Progress{Matched: 3, Applied: 3}, r.Progress)
		for _, agg := range []string{"a", "b", "c"} {
			require.Equal(t, []int64{1}, b.e.seqs(t, agg))
		}
		require.Equal(t, map[operator.Outcome]int{operator.OutcomeRequested: 1, operator.OutcomeApplied: 3}, auditOutcomes(t, b.db, id), "the first wrote no audit row of its failed action")
		require.Equal(t, r, requestRow(t, b.db, id), "the first wrote nothing after the takeover")
		require.Contains(t, log.String(), "another process took over the operator request")
		require.Contains(t, log.String(), "level=WARN")
	})

	t.Run("ProgressIsExactAfterATakeoverFromADeadProcess", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "a", "b", "c", "d", "e")
		g, st := newGate(b.e, "c1", false), newStall()
		first := processor(t, b, g, st.beat, nil)
		t.Cleanup(func() { g.open(); st.open() })
		id := submit(t, b, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true})
		done := serveOne(first)
		// The first process applies a1 and b1 and dies inside the action
		// of c1: its heartbeat stops, and the server rolls back its
		// transaction as it would for a SIGKILLed client.
		<-g.entered
		_, err := b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int64(g.pid.Load()))
		require.NoError(t, err)
		leaseRunOut(t, b.db, id)
		serve(t, processor(t, b, b.e, nil, nil))
		r := wait(t, b, id)
		require.Equal(t, operator.Done, r.Status, r.Error)
		require.Equal(t, operator.Progress{Matched: 5, Applied: 5}, r.Progress, "what the first did is counted")
		for _, agg := range []string{"a", "b", "c", "d", "e"} {
			require.Equal(t, []int64{1}, b.e.seqs(t, agg))
		}
		require.Equal(t, map[operator.Outcome]int{operator.OutcomeRequested: 1, operator.OutcomeApplied: 5}, auditOutcomes(t, b.db, id))
		// The dead process's remains change nothing.
		g.open()
		st.open()
		require.NoError(t, <-done)
		require.Equal(t, r, requestRow(t, b.db, id))
	})

	t.Run("ACancelStopsTheCarrierBeforeItsNextAction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "a", "b", "c")
		g := newGate(b.e, "b1", false)
		first := processor(t, b, g, nil, nil)
		t.Cleanup(g.open)
		id := submit(t, b, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true})
		done := serveOne(first)
		<-g.entered
		c, err := operator.New(&operator.Config{Schema: b.db.Schema}).Cancel(operator.WithActor(ctx, "erin"), b.db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, operator.Cancelled, c.Status)
		require.Equal(t, operator.Progress{Matched: 3, Applied: 1}, c.Progress)
		// b1's action, in flight at the cancel, rolls back; c1 is never
		// tried.
		g.open()
		require.NoError(t, <-done)
		r := requestRow(t, b.db, id)
		require.Equal(t, operator.Cancelled, r.Status)
		require.Equal(t, operator.Progress{Matched: 3, Applied: 1}, r.Progress)
		require.Equal(t, []int64{1}, b.e.seqs(t, "a"))
		require.Empty(t, b.e.seqs(t, "b"))
		require.Empty(t, b.e.seqs(t, "c"))
		require.Equal(t, 1, b.e.callsOf("c1"), "only its first failure")
		require.Equal(t, map[operator.Outcome]int{operator.OutcomeRequested: 1, operator.OutcomeApplied: 1, operator.OutcomeCancelled: 1}, auditOutcomes(t, b.db, id))
	})
}

// TestServeRequestsStopsWithinShutdownGrace: the action in flight when
// ServeRequests' ctx ends gets ShutdownGrace, then its ctx is cancelled;
// the request is left for another process, which finishes it exactly.
func TestServeRequestsStopsWithinShutdownGrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	e := newEffects(t, db)
	cfg := fastConfig(db, 1)
	cfg.RequestPoll, cfg.ShutdownGrace = 20*time.Millisecond, 200*time.Millisecond
	for _, agg := range []string{"a", "b", "c"} {
		p, err := consumer.Handle(db.Pool, "svc", e, cfg)
		require.NoError(t, err)
		e.setFail(agg, consumer.Permanent(errBroken))
		processAll(t, p, 1, rec(agg, 1, agg+"1"))
		e.setFail(agg, nil)
	}
	g := newGate(e, "b1", true)
	t.Cleanup(g.open)
	first, err := consumer.Handle(db.Pool, "svc", g, cfg)
	require.NoError(t, err)
	ops := operator.New(&operator.Config{Schema: db.Schema})
	id, err := ops.Submit(ctx, db.Pool, &operator.Request{Consumer: "svc", Action: operator.Replay, All: true})
	require.NoError(t, err)
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- first.ServeRequests(sctx) }()
	<-g.entered
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("ServeRequests waited past ShutdownGrace for the action in flight")
	}
	r := requestRow(t, db, id)
	require.Equal(t, operator.Running, r.Status)
	require.EqualValues(t, 1, r.Progress.Applied)

	second, err := consumer.Handle(db.Pool, "svc", e, cfg)
	require.NoError(t, err)
	serve(t, second)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	r, err = ops.Wait(wctx, db.Pool, id, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, operator.Done, r.Status, r.Error)
	require.Equal(t, operator.Progress{Matched: 3, Applied: 3}, r.Progress)
	for _, agg := range []string{"a", "b", "c"} {
		require.Equal(t, []int64{1}, e.seqs(t, agg))
	}
}
