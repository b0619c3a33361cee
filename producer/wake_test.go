package producer

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/internal/tables"
)

func TestWakeGate(t *testing.T) {
	t.Parallel()

	t.Run("QuietForAMomentAfterNoRelayWasIdle", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			var g wakeGate
			require.True(t, g.due(), "a new gate asks")
			g.quiet(time.Now())
			require.False(t, g.due(), "right after a write found no relay idle, writes do not ask")
			time.Sleep(wakeQuietFor - time.Nanosecond)
			require.False(t, g.due())
			time.Sleep(time.Nanosecond)
			require.True(t, g.due(), "after wakeQuietFor they ask again")
		})
	})

	t.Run("QuietCountsFromWhenTheStatementWasSent", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			var g wakeGate
			g.quiet(time.Now().Add(-wakeQuietFor))
			require.True(t, g.due(), "a statement that took longer than the quiet time quiets nothing")
			g.quiet(time.Now())
			g.quiet(time.Now().Add(-wakeQuietFor / 2))
			time.Sleep(wakeQuietFor - time.Nanosecond)
			require.False(t, g.due(), "an older answer does not shorten a newer one's quiet")
		})
	})

	t.Run("NilGateAlwaysAsks", func(t *testing.T) {
		t.Parallel()
		var g *wakeGate
		g.quiet(time.Now())
		require.True(t, g.due())
	})

	t.Run("OneGatePerDatabaseAndSchema", func(t *testing.T) {
		t.Parallel()
		srv, err := pgtest.Shared()
		require.NoError(t, err)
		ctx := context.Background()
		begin := func(database string) pgx.Tx {
			t.Helper()
			cfg, err := pgx.ParseConfig(srv.URL)
			require.NoError(t, err)
			cfg.Database = database
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(func() { conn.Close(ctx) })
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(ctx) })
			return tx
		}
		var gs wakeGates
		a1, a2, other := begin("postgres"), begin("postgres"), begin("template1")
		g := gs.forTx(a1, "outbox")
		require.NotNil(t, g)
		require.Same(t, g, gs.forTx(a1, "outbox"), "a connection keeps its gate")
		require.Same(t, g, gs.forTx(a2, "outbox"), "connections to one database share a gate")
		require.NotSame(t, g, gs.forTx(other, "outbox"), "another database has its own")
		require.NotSame(t, g, gs.forTx(a1, "other_schema"), "and so has another schema")
	})

	t.Run("TxWhoseConnPanicsAlwaysAsks", func(t *testing.T) {
		t.Parallel()
		var gs wakeGates
		require.Nil(t, gs.forTx(panickyTx{}, "outbox"))
	})
}

// panickyTx is a test double whose Conn panics, as some mocks' do.
type panickyTx struct{ pgx.Tx }

func (panickyTx) Conn() *pgx.Conn { panic("Conn is not available in this mock") }

// TestWakeAnswersThatAreNotFresh checks that a write whose view of the
// relays was older than its statement does not quiet the writes after it:
// they must still wake a relay that went idle meanwhile.
func TestWakeAnswersThatAreNotFresh(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setup := func(t *testing.T) (*Writer, *pgtest.DB, func() string) {
		t.Helper()
		db := pgtest.New(t, nil)
		listener, channel := listenWake(t, db)
		// next returns the payload of the next notification; a marker sent
		// after a write comes after whatever the write sent.
		next := func() string {
			t.Helper()
			_, err := db.Pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, channel)
			require.NoError(t, err)
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			n, err := listener.WaitForNotification(wctx)
			require.NoError(t, err)
			if n.Payload != "marker" {
				// Drain the marker behind the write's notification.
				_, err := listener.WaitForNotification(wctx)
				require.NoError(t, err)
			}
			return n.Payload
		}
		return NewWriter(&WriterConfig{Schema: db.Schema}), db, next
	}
	event := Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.created"}
	goIdle := func(t *testing.T, db *pgtest.DB) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("relays")+` (relay_id, idle_until) VALUES ('r1', now() + interval '1 hour')`)
		require.NoError(t, err)
	}
	commitWrite := func(t *testing.T, w *Writer, db *pgtest.DB) {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = w.Write(ctx, tx, event)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}

	t.Run("RepeatableReadSnapshot", func(t *testing.T) {
		t.Parallel()
		w, db, next := setup(t)
		old, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		require.NoError(t, err)
		defer old.Rollback(ctx)
		_, err = old.Exec(ctx, `SELECT 1`) // takes the snapshot
		require.NoError(t, err)
		goIdle(t, db)
		_, err = w.Write(ctx, old, Event{AggregateType: "order", AggregateID: "o-2", EventType: "order.created"})
		require.NoError(t, err)
		require.True(t, wakeRegistry.forTx(old, db.Schema).due(), "an answer from an old snapshot quiets nothing")
		require.NoError(t, old.Commit(ctx))
		require.Equal(t, "marker", next(), "the old snapshot saw no relay idle")
		commitWrite(t, w, db)
		require.Equal(t, "", next(), "the next write still asks, and wakes the relay")
	})

	t.Run("StatementThatWaitedForALock", func(t *testing.T) {
		t.Parallel()
		w, db, next := setup(t)
		// holder keeps the aggregate's sequence row locked (with plain SQL,
		// so that the gate is still fresh for the write that waits).
		holder, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer holder.Rollback(ctx)
		_, err = holder.Exec(ctx, `INSERT INTO `+db.Table("sequences")+` (aggregate_type, aggregate_id, last_seq) VALUES ('order', 'o-1', 1)`)
		require.NoError(t, err)
		done := make(chan error, 1)
		var dueAfter bool
		go func() {
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				done <- err
				return
			}
			defer tx.Rollback(ctx)
			if _, err := w.Write(ctx, tx, event); err != nil {
				done <- err
				return
			}
			dueAfter = wakeRegistry.forTx(tx, db.Schema).due()
			done <- tx.Commit(ctx)
		}()
		// Once the waiting write has blocked, the relay goes idle; the
		// waiting statement's snapshot is older than that.
		deadline := time.Now().Add(20 * time.Second)
		for {
			var waiting bool
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%sequences%')`).Scan(&waiting))
			if waiting {
				break
			}
			require.True(t, time.Now().Before(deadline), "the second write never waited for the lock")
			time.Sleep(5 * time.Millisecond)
		}
		goIdle(t, db)
		// Let the wait outlast the quiet time, so that only counting the
		// quiet from the statement's start keeps it from mattering.
		time.Sleep(2 * wakeQuietFor)
		require.NoError(t, holder.Commit(ctx))
		require.NoError(t, <-done)
		require.True(t, dueAfter, "an answer from a snapshot older than the quiet time quiets nothing")
		require.Equal(t, "marker", next(), "the waiting write's snapshot saw no relay idle")
		commitWrite(t, w, db)
		require.Equal(t, "", next(), "a write after the relay went idle wakes it")
	})
}

// wakeSlotSQL is the wake slot of the server's clock, as wakeColumns
// computes it for a statement.
const wakeSlotSQL = `((extract(epoch FROM clock_timestamp()) * 1000)::bigint / $1 % 2147483647)::int`

// TestWakeOneNotifierPerSlot checks that while a relay is idle, the writes
// of one wake slot send one notification between them, not one each, and
// that the writes that skip leave their events to a later notification.
func TestWakeOneNotifierPerSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// setup returns a writer on a schema whose relay says it is idle, and
	// a count of the notifications its channel received, taken after a
	// marker.
	setup := func(t *testing.T) (*Writer, *pgtest.DB, func() int) {
		t.Helper()
		db := pgtest.New(t, &pgtest.Opts{MaxConns: 24})
		_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("relays")+` (relay_id, idle_until) VALUES ('r1', now() + interval '1 hour')`)
		require.NoError(t, err)
		listener, channel := listenWake(t, db)
		received := func() int {
			t.Helper()
			_, err := db.Pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, channel)
			require.NoError(t, err)
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			n := 0
			for {
				note, err := listener.WaitForNotification(wctx)
				require.NoError(t, err)
				if note.Payload == "marker" {
					return n
				}
				n++
			}
		}
		return NewWriter(&WriterConfig{Schema: db.Schema}), db, received
	}
	write := func(t *testing.T, w *Writer, tx pgx.Tx, agg string) wakeAnswer {
		t.Helper()
		_, wake, err := w.writeOne(ctx, tx, &Event{AggregateType: "order", AggregateID: agg, EventType: "order.created"}, true)
		require.NoError(t, err)
		return wake
	}
	slotNow := func(t *testing.T, db *pgtest.DB) int32 {
		t.Helper()
		var slot int32
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT `+wakeSlotSQL, tables.WakeSlotMillis).Scan(&slot))
		return slot
	}

	t.Run("SkipsWhileAnotherWriteHoldsTheSlot", func(t *testing.T) {
		t.Parallel()
		w, db, received := setup(t)
		// holder stands for a write that notifies and has not committed:
		// it holds the wake locks of the next second's slots. The check
		// after the write makes sure the write ran inside them, and tries
		// again if the machine stalled for longer.
		const slots = 200
		// try reports false if the write ran after the held slots.
		try := func() bool {
			holder, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer holder.Rollback(ctx)
			var first int32
			require.NoError(t, holder.QueryRow(ctx, `SELECT min(s) FROM (SELECT s, pg_advisory_xact_lock($2, s)
			    FROM generate_series(`+wakeSlotSQL+`, `+wakeSlotSQL+` + $3 - 1) AS s) AS locked`,
				tables.WakeSlotMillis, tables.WakeLockKey(db.Schema), slots).Scan(&first))
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			wake := write(t, w, tx, "o-1")
			if slotNow(t, db) >= first+slots {
				return false
			}
			require.Equal(t, tables.WakeOtherNotifies, wake.did, "another write holds the slot: this one skips")
			require.True(t, wakeRegistry.forTx(tx, db.Schema).due(), "a write that skipped quiets nothing: the notifying write may roll back")
			require.NoError(t, tx.Commit(ctx))
			require.Equal(t, 0, received(), "the write that skipped sent nothing")
			// The deferred rollback: the notifying write rolls back, and
			// the next write notifies.
			return true
		}
		for attempt := 0; !try(); attempt++ {
			require.Less(t, attempt, 5, "no write ran within a second of taking the slots' locks")
		}
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		require.Equal(t, tables.WakeNotified, write(t, w, tx, "o-2").did)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, 1, received(), "the next write wakes the relay, for both events")
	})

	t.Run("SeveralEventsNotifyOnce", func(t *testing.T) {
		t.Parallel()
		w, db, received := setup(t)
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		events := []Event{
			{AggregateType: "order", AggregateID: "o-1", EventType: "order.created"},
			{AggregateType: "order", AggregateID: "o-2", EventType: "order.created"},
			{AggregateType: "order", AggregateID: "o-1", EventType: "order.paid"},
		}
		written, wake, err := w.writeMany(ctx, tx, events, true)
		require.NoError(t, err)
		require.Len(t, written, 3)
		require.Equal(t, tables.WakeNotified, wake.did)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, 1, received(), "one statement, one notification")
	})

	t.Run("SixteenWritersInFlight", func(t *testing.T) {
		t.Parallel()
		w, db, received := setup(t)
		// Sixteen transactions write at once and commit only when all have
		// written. Without the slots each would notify; with them, one
		// per slot the writes spanned does. Writes spread over sixteen
		// slots or more prove nothing, and are tried again.
		const writers = 16
		// try reports false if the writes spread over sixteen slots.
		try := func() bool {
			first := slotNow(t, db)
			txs := make([]pgx.Tx, writers)
			answers := make([]wakeAnswer, writers)
			errs := make([]error, writers)
			for i := range writers {
				tx, err := db.Pool.Begin(ctx)
				require.NoError(t, err)
				defer tx.Rollback(ctx)
				txs[i] = tx
			}
			var wg sync.WaitGroup
			for i := range writers {
				wg.Go(func() {
					_, answers[i], errs[i] = w.writeOne(ctx, txs[i], &Event{AggregateType: "order", AggregateID: strconv.Itoa(i), EventType: "order.created"}, true)
				})
			}
			wg.Wait()
			spanned := int(slotNow(t, db)-first) + 1
			notified := 0
			for i, a := range answers {
				require.NoError(t, errs[i])
				require.Contains(t, []int{tables.WakeNotified, tables.WakeOtherNotifies}, a.did, "write %d", i)
				if a.did == tables.WakeNotified {
					notified++
				}
			}
			for _, tx := range txs {
				require.NoError(t, tx.Commit(ctx))
			}
			require.Equal(t, notified, received(), "each write that said it notified did, and no other")
			if spanned >= writers {
				return false
			}
			require.GreaterOrEqual(t, notified, 1, "a relay is idle: some write wakes it")
			require.LessOrEqual(t, notified, spanned, "at most one notifying write per wake slot")
			t.Logf("%d writes over %d wake slots sent %d notifications", writers, spanned, notified)
			return true
		}
		for attempt := 0; !try(); attempt++ {
			require.Less(t, attempt, 5, "sixteen writes never fitted in fewer than sixteen wake slots")
		}
	})
}

// listenWake returns a connection listening on db's wake channel, closed
// when t ends, and the channel.
func listenWake(t *testing.T, db *pgtest.DB) (*pgx.Conn, string) {
	t.Helper()
	ctx := context.Background()
	listener, err := pgx.Connect(ctx, db.Server.URL)
	require.NoError(t, err)
	t.Cleanup(func() { listener.Close(ctx) })
	channel := tables.WakeChannel(db.Schema)
	_, err = listener.Exec(ctx, "LISTEN "+channel)
	require.NoError(t, err)
	return listener, channel
}
