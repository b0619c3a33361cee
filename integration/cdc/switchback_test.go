package cdc_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// TestSwitchBackChecksSlot switches a schema back from CDC to the relay
// with a slot that no connector reads: the test plays the connector by
// advancing the slot with pg_replication_slot_advance. It needs only the
// server (wal_level=logical), no broker.
func TestSwitchBackChecksSlot(t *testing.T) {
	ctx := context.Background()
	for _, partitioned := range []bool{false, true} {
		t.Run("partitioned="+strconv.FormatBool(partitioned), func(t *testing.T) {
			db := pgtest.New(t, &pgtest.Opts{PartitionEventsByDay: partitioned})
			slot := "sb_" + db.Schema
			pub := pgx.Identifier{"sbp_" + db.Schema}.Sanitize()
			_, err := db.Pool.Exec(ctx, `CREATE PUBLICATION `+pub+` FOR TABLE `+db.Table("events")+` WITH (publish_via_partition_root = true)`)
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP PUBLICATION `+pub) })
			_, err = db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot) })
			require.NoError(t, producer.SetDispatch(ctx, db.Pool, producer.DispatchCDC, &producer.DispatchConfig{Schema: db.Schema, Slot: slot, Logger: quiet}))
			back := &producer.DispatchConfig{Schema: db.Schema, Logger: quiet}
			write := func(cdc bool, seq string) {
				t.Helper()
				require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					_, err := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema, CDC: cdc}).Write(ctx, tx,
						producer.Event{AggregateType: "a", AggregateID: "1", EventType: seq})
					return err
				}))
			}
			advance := func() {
				t.Helper()
				_, err := db.Pool.Exec(ctx, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, slot)
				require.NoError(t, err)
			}
			in, err := producer.NewInspector(db.Pool, db.Schema)
			require.NoError(t, err)
			mode := func() producer.Dispatch {
				t.Helper()
				st, err := in.Dispatch(ctx)
				require.NoError(t, err)
				return st.Mode
			}

			// Nothing written in CDC mode: the slot has nothing to confirm,
			// whatever WAL other schemas wrote since.
			require.NoError(t, producer.SetDispatch(ctx, db.Pool, producer.DispatchRelay, back))
			require.NoError(t, producer.SetDispatch(ctx, db.Pool, producer.DispatchCDC, &producer.DispatchConfig{Schema: db.Schema, Slot: slot, Logger: quiet}))

			// seq 1 in CDC mode, not streamed: the switch back refuses and
			// names the slot and the lag.
			write(true, "seq-1")
			err = producer.SetDispatch(ctx, db.Pool, producer.DispatchRelay, back)
			var lag *producer.SlotLagError
			require.ErrorAs(t, err, &lag)
			require.Equal(t, slot, lag.Slot)
			require.EqualValues(t, 1, lag.Pending)
			require.Positive(t, lag.LagBytes)
			require.ErrorContains(t, err, "DispatchConfig.Wait")
			require.Equal(t, producer.DispatchCDC, mode(), "a refused switch changes nothing")

			// Waiting, bounded by ctx: still not streamed.
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			err = producer.SetDispatch(short, db.Pool, producer.DispatchRelay, &producer.DispatchConfig{Schema: db.Schema, Logger: quiet, Wait: true})
			require.ErrorAs(t, err, &lag)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Equal(t, producer.DispatchCDC, mode())

			// Waiting while the "connector" catches up: the switch returns
			// once the slot confirmed seq 1.
			done := make(chan error, 1)
			go func() {
				done <- producer.SetDispatch(ctx, db.Pool, producer.DispatchRelay, &producer.DispatchConfig{Schema: db.Schema, Logger: quiet, Wait: true})
			}()
			advance()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(time.Minute):
				t.Fatal("SetDispatch with Wait did not return within a minute of the slot catching up")
			}
			require.Equal(t, producer.DispatchRelay, mode())
			write(false, "seq-2")
			h, err := in.Health(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 1, h.Undelivered, "relay mode: a new event waits for a relay")

			// A slot that is gone cannot be asked: refused, unless told.
			_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET published_at = now()`)
			require.NoError(t, err)
			require.NoError(t, producer.SetDispatch(ctx, db.Pool, producer.DispatchCDC, &producer.DispatchConfig{Schema: db.Schema, Slot: slot, Logger: quiet}))
			write(true, "seq-3")
			_, err = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
			require.NoError(t, err)
			require.ErrorContains(t, producer.SetDispatch(ctx, db.Pool, producer.DispatchRelay, back), "SkipSlotCheck")
			require.NoError(t, producer.SetDispatch(ctx, db.Pool, producer.DispatchRelay, &producer.DispatchConfig{Schema: db.Schema, Logger: quiet, SkipSlotCheck: true}))
			require.Equal(t, producer.DispatchRelay, mode())
		})
	}
}

// TestSwitchBackWaitsForConnector is issue 24's item 5 with the real
// Debezium connector: in CDC mode seq 1 is written while the connector is
// paused, the schema is switched back to the relay and seq 2 is written
// for it. Before the switch checked the slot, the relay put seq 2 on the
// topic while seq 1 was still in the slot; now the switch refuses, and
// with Wait returns only after the connector streamed seq 1.
func TestSwitchBackWaitsForConnector(t *testing.T) {
	w := need(t)
	c := newCDC(t, w, 1, nil)
	ctx := context.Background()
	write := func(wr *producer.Writer, seq string) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, c.db.Pool, func(tx pgx.Tx) error {
			_, err := wr.Write(ctx, tx, producer.Event{AggregateType: "a", AggregateID: "agg", EventType: seq, Topic: c.topic})
			return err
		}))
	}
	connector := func(verb string) {
		t.Helper()
		status, out := w.rest(t, http.MethodPut, "/connectors/"+c.name+"/"+verb, nil)
		require.Equal(t, http.StatusAccepted, status, "%s connector %s: %s", verb, c.name, out)
	}

	// The connector streams: a switch back right after a write succeeds
	// once the connector confirmed it.
	write(c.writer, "seq-0")
	recs := w.broker.Records(t, c.topic, 1, time.Minute)
	require.Len(t, recs, 1)

	connector("pause")
	require.True(t, eventually.Within(time.Minute, func() bool { s, _ := c.state(); return s == "PAUSED,PAUSED" }), "connector %s did not pause", c.name)
	write(c.writer, "seq-1")
	err := producer.SetDispatch(ctx, c.db.Pool, producer.DispatchRelay, &producer.DispatchConfig{Schema: c.db.Schema, Logger: quiet})
	var lag *producer.SlotLagError
	require.ErrorAs(t, err, &lag)
	require.Equal(t, c.slot, lag.Slot)
	require.GreaterOrEqual(t, lag.Pending, int64(1), "seq 1, and seq 0 if the worker has not committed its offsets since")
	t.Logf("refused: %v", err)

	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- producer.SetDispatch(waitCtx, c.db.Pool, producer.DispatchRelay, &producer.DispatchConfig{Schema: c.db.Schema, Logger: testLogger(t), Wait: true})
	}()
	connector("resume")
	require.NoError(t, <-done)

	// seq 2 for the relay, which runs beside the connector (still there:
	// it would send what it had not streamed).
	write(producer.NewWriter(&producer.WriterConfig{Schema: c.db.Schema}), "seq-2")
	relay, err := producer.NewRelay(c.db.Pool, w.broker.Client(t), &producer.RelayConfig{Schema: c.db.Schema, Logger: quiet})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- relay.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()

	// The connector streams seq 2 too (it captures every insert), and the
	// consumers' dedupe absorbs the copy: four records, and the first of
	// each in seq order.
	recs = w.broker.Records(t, c.topic, 4, time.Minute)
	require.Len(t, recs, 4)
	var order []string
	seen := map[string]bool{}
	for _, r := range recs {
		h := headers(r)
		t.Logf("offset %d: %s %s", r.Offset, h[outbox.HeaderEventType], h[outbox.HeaderEventID])
		if !seen[h[outbox.HeaderEventID]] {
			seen[h[outbox.HeaderEventID]] = true
			order = append(order, h[outbox.HeaderEventType])
		}
	}
	require.Equal(t, []string{"seq-0", "seq-1", "seq-2"}, order, "the topic in offset order")
}
