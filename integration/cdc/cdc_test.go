package cdc_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgserver"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// The tests of this package run one at a time: they share one Connect
// worker, which one of them kills, and one PostgreSQL server, which one of
// them restarts.

// TestWireContract checks that what Debezium's router puts on the topic is
// our wire contract, record by record against the events table: the key is
// the aggregate id as plain text, the value the payload bytes unchanged,
// the headers named as the consumer reads them with plain text values, no
// __debezium headers; and that deletes (Prune) and updates of the table
// put nothing on the topic: no tombstones, no change events.
func TestWireContract(t *testing.T) {
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned=%v", partitioned), func(t *testing.T) {
			w := need(t)
			c := newCDC(t, w, 2, &pgtest.Opts{PartitionEventsByDay: partitioned})
			ctx := context.Background()
			events := []producer.Event{
				{AggregateType: "order", AggregateID: "o-1", EventType: "order.placed", Payload: []byte{0x00, 0x01, 0xff, '{', '}'},
					ContentType: "application/octet-stream", Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
				{AggregateType: "order", AggregateID: "o-1", EventType: "order.paid", Payload: []byte(`{"amount": 10, "b": 1, "a": 2}`), IdempotencyKey: "pay-o-1"},
				{AggregateType: "order", AggregateID: "o-2", EventType: "order.placed", Payload: nil},
				{AggregateType: "invoice", AggregateID: "i-1", EventType: "invoice.sent", Payload: []byte("x"), Topic: c.topic},
			}
			var written []producer.Written
			require.NoError(t, pgx.BeginFunc(ctx, c.db.Pool, func(tx pgx.Tx) error {
				var err error
				written, err = c.writer.Write(ctx, tx, events...)
				return err
			}))
			// A rolled-back write never reaches the topic.
			require.ErrorIs(t, pgx.BeginFunc(ctx, c.db.Pool, func(tx pgx.Tx) error {
				if _, err := c.writer.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: "o-9", EventType: "never"}); err != nil {
					return err
				}
				return errRollback
			}), errRollback)

			recs := w.broker.Records(t, c.topic, len(events), time.Minute)
			require.Len(t, recs, len(events))
			type row struct {
				EventID, Key, AggType, AggID, EventType string
				Seq                                     int64
				ContentType                             *string
				Payload                                 []byte
				Headers                                 string
				CreatedAt                               time.Time
			}
			rows, err := c.db.Pool.Query(ctx, `SELECT event_id::text, idempotency_key, aggregate_type, aggregate_id, event_type,
				aggregate_seq, content_type, payload, headers::text, created_at FROM `+c.db.Table("events"))
			require.NoError(t, err)
			stored, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
			require.NoError(t, err)
			byID := map[string]row{}
			for _, r := range stored {
				byID[r.EventID] = r
			}
			for _, rec := range recs {
				h := headers(rec)
				t.Logf("record %s/%d@%d key=%q value=%q headers=%v", rec.Topic, rec.Partition, rec.Offset, rec.Key, rec.Value, h)
				r, ok := byID[h[outbox.HeaderEventID]]
				require.True(t, ok, "record with event id %q, which no row has", h[outbox.HeaderEventID])
				require.Equal(t, r.AggID, string(rec.Key), "key: the aggregate id as plain text")
				require.Equal(t, r.Payload, nonNil(rec.Value), "value: the payload bytes unchanged")
				require.Equal(t, r.Key, h[outbox.HeaderIdempotencyKey])
				require.Equal(t, r.EventID, h[outbox.HeaderDebeziumID], "the router's own id header is the event id")
				require.Equal(t, r.EventType, h[outbox.HeaderEventType])
				require.Equal(t, r.AggType, h[outbox.HeaderAggregateType])
				require.Equal(t, r.AggID, h[outbox.HeaderAggregateID])
				require.Equal(t, strconv.FormatInt(r.Seq, 10), h[outbox.HeaderAggregateSeq], "sequence: a decimal")
				if r.ContentType != nil {
					require.Equal(t, *r.ContentType, h[outbox.HeaderContentType])
				} else {
					require.Empty(t, h[outbox.HeaderContentType])
				}
				at, err := time.Parse(time.RFC3339Nano, h[outbox.HeaderOccurredAt])
				require.NoError(t, err, "occurred-at: RFC 3339")
				require.True(t, r.CreatedAt.Equal(at), "occurred-at %s is created_at %s", at, r.CreatedAt)
				var want, got map[string]string
				require.NoError(t, json.Unmarshal([]byte(r.Headers), &want))
				require.NoError(t, json.Unmarshal([]byte(h[outbox.HeaderCDCHeaders]), &got), "the caller's headers as one JSON object")
				require.Equal(t, want, got)
				for k := range h {
					require.NotContains(t, k, "__debezium", "extended headers must be off")
				}
			}
			for i, wr := range written {
				require.Contains(t, byID, wr.EventID, "event %d", i)
			}

			// Deletes and updates of the table: the router drops them,
			// and Debezium sends no tombstone.
			_, err = c.db.Pool.Exec(ctx, `UPDATE `+c.db.Table("events")+` SET last_error = 'touched'`)
			require.NoError(t, err)
			res, err := producer.Prune(ctx, c.db.Pool, &producer.PruneConfig{Schema: c.db.Schema, Retention: time.Nanosecond})
			require.NoError(t, err)
			if !partitioned {
				require.EqualValues(t, len(events), res.Deleted, "CDC mode: Prune deletes by age")
			} else {
				_, err = c.db.Pool.Exec(ctx, `DELETE FROM `+c.db.Table("events"))
				require.NoError(t, err)
			}
			// A marker event after them: once it is on the topic, so
			// would anything the deletes and updates had produced.
			require.NoError(t, pgx.BeginFunc(ctx, c.db.Pool, func(tx pgx.Tx) error {
				_, err := c.writer.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: "marker", EventType: "marker"})
				return err
			}))
			all := w.broker.Records(t, c.topic, len(events)+1, time.Minute)
			require.Len(t, all, len(events)+1)
			var markers int
			for _, rec := range all {
				require.NotNil(t, rec.Value, "a tombstone at %d@%d", rec.Partition, rec.Offset)
				if string(rec.Key) == "marker" {
					markers++
				}
			}
			require.Equal(t, 1, markers, "the marker is the only record after the first ones")
			// Nothing more arrives, whatever the partition.
			require.Len(t, w.broker.Records(t, c.topic, len(events)+2, 3*time.Second), len(events)+1)
		})
	}
}

var errRollback = fmt.Errorf("roll back on purpose")

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// TestEndToEnd: writers commit and roll back through producer.Write,
// Debezium publishes, the SDK's consumer applies every event once in
// sequence order: 0 lost, phantom, duplicate effects and reorders.
func TestEndToEnd(t *testing.T) {
	w := need(t)
	p := newPipeline(newCDC(t, w, 4, nil))
	stopConsumer := p.startConsumer()
	defer stopConsumer()
	writersDone := p.startWriters(load{Writers: 4, Aggregates: 40, MaxPerTx: 3, Rollback: 0.1, Limit: 1500, MaxPause: 5 * time.Millisecond})
	writersDone()
	p.waitApplied(2 * time.Minute)
	rep := p.check()
	require.Positive(t, rep.RolledBack, "some writes rolled back")
}

// TestConnectKilled: the Connect worker is killed with SIGKILL while
// writers write, started again and the connector registered again: it
// resumes from the offsets it flushed, so it sends some records a second
// time, and the consumer's dedupe absorbs them.
func TestConnectKilled(t *testing.T) {
	w := need(t)
	w.needScript(t)
	p := newPipeline(newCDC(t, w, 4, nil))
	stopConsumer := p.startConsumer()
	defer stopConsumer()
	writersDone := p.startWriters(load{Writers: 4, Aggregates: 40, MaxPerTx: 3, Rollback: 0.1, Limit: 4000, MaxPause: 20 * time.Millisecond})
	waitFor(t, time.Minute, "a third applied before the kill", func() bool { return p.applied() > 1000 })
	_, _ = w.worker(t, "kill")
	applied := p.applied()
	_, _ = w.worker(t, "restart")
	p.register()
	writersDone()
	p.waitApplied(3 * time.Minute)
	rep := p.check()
	t.Logf("killed at %d applied; %d records redelivered after the restart, skipped as duplicates", applied, p.duplicates.Load())
	require.Positive(t, rep.Committed-applied, "writes went on after the kill")
}

// TestPostgresRestart: the PostgreSQL server crashes (immediate shutdown)
// and comes back while writers write; Debezium reconnects to its slot and
// goes on from its confirmed position. The server is a cluster of the
// test's own (pgtest.Own), whatever TEST_DATABASE_URL says.
func TestPostgresRestart(t *testing.T) {
	w := need(t)
	p := newPipeline(newCDC(t, w, 4, &pgtest.Opts{Server: pgtest.Own(t, pgserver.Config{LogicalReplication: true})}))
	stopConsumer := p.startConsumer()
	defer stopConsumer()
	writersDone := p.startWriters(load{Writers: 4, Aggregates: 40, MaxPerTx: 3, Rollback: 0.1, Limit: 3000, MaxPause: 20 * time.Millisecond})
	waitFor(t, time.Minute, "some applied before the restart", func() bool { return p.applied() > 500 })
	start := time.Now()
	require.NoError(t, p.db.Server.Restart())
	t.Logf("PostgreSQL restarted in %s", time.Since(start).Round(time.Millisecond))
	writersDone()
	p.waitStreamingAgain()
	p.waitApplied(3 * time.Minute)
	p.check()
	p.mu.Lock()
	t.Logf("%d write attempts failed while the server was away", p.writeErrors)
	p.mu.Unlock()
}

// waitStreamingAgain waits until the connector streams again after an
// outage, as Debezium's retriable-error restart brings it back.
func (p *pipeline) waitStreamingAgain() {
	p.t.Helper()
	p.waitStreaming(3 * time.Minute)
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	eventually.True(t, within, cond, what)
}

// TestSetDispatchChecks runs the checks of producer.SetDispatch that need
// a real slot: a slot of another plugin, no publication, a partitioned
// table published without its root, and undelivered events.
func TestSetDispatchChecks(t *testing.T) {
	need(t)
	ctx := context.Background()
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned=%v", partitioned), func(t *testing.T) {
			db := pgtest.New(t, &pgtest.Opts{PartitionEventsByDay: partitioned})
			slot := "chk_" + db.Schema
			_, err := db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot) })
			cfg := &producer.DispatchConfig{Schema: db.Schema, Slot: slot, Logger: quiet}

			err = producer.SetDispatch(ctx, db.Pool, producer.DispatchCDC, cfg)
			require.ErrorContains(t, err, "in no publication")
			pub := pgx.Identifier{"p_" + db.Schema}.Sanitize()
			_, err = db.Pool.Exec(ctx, `CREATE PUBLICATION `+pub+` FOR TABLE `+db.Table("events"))
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP PUBLICATION `+pub) })
			if partitioned {
				err = producer.SetDispatch(ctx, db.Pool, producer.DispatchCDC, cfg)
				require.ErrorContains(t, err, "publish_via_partition_root")
				_, err = db.Pool.Exec(ctx, `ALTER PUBLICATION `+pub+` SET (publish_via_partition_root = true)`)
				require.NoError(t, err)
			}

			// An event written for the relay, not yet delivered.
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}).Write(ctx, tx,
					producer.Event{AggregateType: "a", AggregateID: "1", EventType: "x"})
				return err
			}))
			err = producer.SetDispatch(ctx, db.Pool, producer.DispatchCDC, cfg)
			require.ErrorContains(t, err, "1 events are undelivered")
			_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("events")+` SET published_at = now()`)
			require.NoError(t, err)

			require.NoError(t, producer.SetDispatch(ctx, db.Pool, producer.DispatchCDC, cfg))
			in, err := producer.NewInspector(db.Pool, db.Schema)
			require.NoError(t, err)
			h, err := in.Health(ctx)
			require.NoError(t, err)
			require.Equal(t, producer.DispatchCDC, h.Dispatch)
			require.Equal(t, slot, h.CDCSlot)
			require.True(t, h.CDCSlotExists)
			require.False(t, h.CDCSlotActive, "no connector reads the slot")
			// The slot holds the WAL of what was written since: 64 KiB of
			// random bytes, which compression cannot shrink.
			big := make([]byte, 64<<10)
			_, _ = rand.Read(big)
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema, CDC: true}).Write(ctx, tx,
					producer.Event{AggregateType: "a", AggregateID: "1", EventType: "x", Payload: big})
				return err
			}))
			h, err = in.Health(ctx)
			require.NoError(t, err)
			require.Zero(t, h.Undelivered, "CDC mode: events are written as published")
			require.Greater(t, h.CDCRetainedWALBytes, int64(64<<10))
			require.Greater(t, h.CDCLagBytes, int64(64<<10))

			// And back, once the slot confirmed what was written in CDC
			// mode (TestSwitchBackChecksSlot covers the refusal).
			var lag *producer.SlotLagError
			require.ErrorAs(t, producer.SetDispatch(ctx, db.Pool, producer.DispatchRelay, &producer.DispatchConfig{Schema: db.Schema, Logger: quiet}), &lag)
			_, err = db.Pool.Exec(ctx, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, slot)
			require.NoError(t, err)
			require.NoError(t, producer.SetDispatch(ctx, db.Pool, producer.DispatchRelay, &producer.DispatchConfig{Schema: db.Schema, Logger: quiet}))
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}).Write(ctx, tx,
					producer.Event{AggregateType: "a", AggregateID: "1", EventType: "x"})
				return err
			}))
			h, err = in.Health(ctx)
			require.NoError(t, err)
			require.Equal(t, producer.DispatchRelay, h.Dispatch)
			require.EqualValues(t, 1, h.Undelivered, "relay mode: a new event waits for a relay")
		})
	}
}
