package producer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// TestDispatch covers what of CDC mode needs no replication slot: the
// checks of SetDispatch, the writer's CDC mode, Prune by age, and the relay
// refusing to run or stopping. The switch itself, with a real slot and a
// connector, is tested in integration/cdc (wal_level=logical).
func TestDispatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// forceCDC puts the schema in CDC mode as SetDispatch would, without
	// the slot that this package's server (wal_level=replica) cannot have.
	forceCDC := func(t *testing.T, db *pgtest.DB) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, `ALTER TABLE `+db.Table("events")+` ALTER COLUMN published_at SET DEFAULT now();
			UPDATE `+db.Table("dispatch")+` SET mode = 'cdc', slot_name = 'test_slot'`)
		require.NoError(t, err)
	}

	t.Run("NewSchemaIsRelayMode", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		st, err := inspector(t, db).Dispatch(ctx)
		require.NoError(t, err)
		require.Equal(t, producer.DispatchRelay, st.Mode)
		require.Empty(t, st.Slot)
		h, err := inspector(t, db).Health(ctx)
		require.NoError(t, err)
		require.Equal(t, producer.DispatchRelay, h.Dispatch)
		require.Empty(t, h.CDCSlot)
		require.False(t, h.CDCSlotActive)
	})

	t.Run("SetDispatchRefusesBadInput", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		for _, tc := range []struct {
			name string
			mode producer.Dispatch
			cfg  *producer.DispatchConfig
			want string
		}{
			{"UnknownMode", "kafka", &producer.DispatchConfig{Schema: db.Schema}, `unknown mode "kafka"`},
			{"CDCWithoutSlot", producer.DispatchCDC, &producer.DispatchConfig{Schema: db.Schema}, "needs DispatchConfig.Slot"},
			{"SlotMissing", producer.DispatchCDC, &producer.DispatchConfig{Schema: db.Schema, Slot: "no_such_slot"}, `no replication slot "no_such_slot"`},
			{"SchemaNotMigrated", producer.DispatchRelay, &producer.DispatchConfig{Schema: "not_migrated_" + db.Schema}, "run Migrate first"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := producer.SetDispatch(ctx, db.Pool, tc.mode, tc.cfg)
				require.ErrorContains(t, err, tc.want)
			})
		}
		st, err := inspector(t, db).Dispatch(ctx)
		require.NoError(t, err)
		require.Equal(t, producer.DispatchRelay, st.Mode, "a refused switch changes nothing")
	})

	t.Run("CDCWriterFillsTopicAndEventsCountAsPublished", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		forceCDC(t, db)
		for _, tc := range []struct {
			name, writerTopic, eventTopic, want string
		}{
			{"OwnTopic", "default-topic", "own-topic", "own-topic"},
			{"WriterTopic", "default-topic", "", "default-topic"},
			{"AggregateType", "", "", "account"},
		} {
			w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema, CDC: true, Topic: tc.writerTopic})
			var written []producer.Written
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				var err error
				// Two events: the single-event and the many-event
				// statements both fill the column.
				written, err = w.Write(ctx, tx,
					producer.Event{AggregateType: "account", AggregateID: tc.name, EventType: "opened", Topic: tc.eventTopic},
					producer.Event{AggregateType: "account", AggregateID: tc.name, EventType: "credited", Topic: tc.eventTopic})
				if err != nil {
					return err
				}
				_, err = w.Write(ctx, tx, producer.Event{AggregateType: "account", AggregateID: tc.name, EventType: "closed", Topic: tc.eventTopic})
				return err
			}))
			require.Len(t, written, 2)
			r, err := db.Pool.Query(ctx, `SELECT topic, published_at IS NOT NULL FROM `+db.Table("events")+` WHERE aggregate_id = $1 ORDER BY id`, tc.name)
			require.NoError(t, err)
			type row struct {
				Topic     string
				Published bool
			}
			rows, err := pgx.CollectRows(r, pgx.RowToStructByPos[row])
			require.NoError(t, err)
			require.Equal(t, []row{{tc.want, true}, {tc.want, true}, {tc.want, true}}, rows, tc.name)
		}
		h, err := inspector(t, db).Health(ctx)
		require.NoError(t, err)
		require.Zero(t, h.Undelivered, "in CDC mode nothing waits for a relay")
		require.Zero(t, h.OldestUndelivered)
		require.Equal(t, producer.DispatchCDC, h.Dispatch)
		require.Equal(t, "test_slot", h.CDCSlot)
		require.False(t, h.CDCSlotExists, "the slot was never created")
		require.False(t, h.CDCSlotActive)
	})

	t.Run("PruneDeletesByAgeInCDCMode", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		forceCDC(t, db)
		w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema, CDC: true})
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, producer.Event{AggregateType: "a", AggregateID: "1", EventType: "x"},
				producer.Event{AggregateType: "a", AggregateID: "2", EventType: "x"})
			return err
		}))
		// Nothing is old enough yet.
		res, err := producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema, Retention: time.Hour})
		require.NoError(t, err)
		require.Zero(t, res.Deleted)
		// Everything is, with a retention shorter than the rows' age.
		res, err = producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema, Retention: time.Nanosecond})
		require.NoError(t, err)
		require.EqualValues(t, 2, res.Deleted, "CDC mode: deleted by age although no relay set published_at")
		var left int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("events")).Scan(&left))
		require.Zero(t, left)
	})

	t.Run("RelayRefusesToRunInCDCMode", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		forceCDC(t, db)
		broker := kafkatest.New(t)
		relay, err := producer.NewRelay(db.Pool, broker.Client(t), &producer.RelayConfig{Schema: db.Schema, Logger: testLogger(t)})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err = relay.Run(ctx)
		require.ErrorIs(t, err, producer.ErrCDCDispatch)
		require.ErrorContains(t, err, "producer.DispatchRelay")
		require.ErrorContains(t, err, db.Schema)
	})

	t.Run("RunningRelayStopsWhenSwitched", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 1)
		pool, err := pgxpool.New(ctx, b.db.Server.URL)
		require.NoError(t, err)
		defer pool.Close()
		relay, err := producer.NewRelay(pool, b.broker.Client(t), &producer.RelayConfig{Schema: b.db.Schema, Logger: testLogger(t),
			RebalanceInterval: 100 * time.Millisecond})
		require.NoError(t, err)
		runCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- relay.Run(runCtx) }()
		b.write(t, b.event("before"))
		require.Len(t, b.broker.Records(t, b.topic, 1, 30*time.Second), 1, "the relay publishes in relay mode")
		forceCDC(t, b.db)
		select {
		case err := <-done:
			require.ErrorIs(t, err, producer.ErrCDCDispatch)
		case <-time.After(30 * time.Second):
			t.Fatal("the relay did not stop within 30s of the switch to CDC mode")
		}
		if errors.Is(runCtx.Err(), context.DeadlineExceeded) {
			t.Fatal("the relay stopped only at its deadline")
		}
	})
}
