package producer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

func TestWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setup := func(t *testing.T) (*producer.Writer, *pgtest.DB) {
		t.Helper()
		db := pgtest.New(t, nil)
		return producer.NewWriter(&producer.WriterConfig{Schema: db.Schema, MaxRecordBytes: 8 << 10}), db
	}
	count := func(t *testing.T, db *pgtest.DB) int {
		t.Helper()
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("events")).Scan(&n))
		return n
	}
	event := func(agg string) producer.Event {
		return producer.Event{AggregateType: "order", AggregateID: agg, EventType: "order.created", Payload: []byte(`{"b":1,"a":2}`)}
	}

	t.Run("CommitKeepsEvents", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		written, err := w.Write(ctx, tx, event("o-1"), event("o-2"), event("o-1"))
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, []int64{1, 1, 2}, []int64{written[0].Seq, written[1].Seq, written[2].Seq})
		require.Less(t, written[0].ID, written[2].ID)
		require.Equal(t, 3, count(t, db))

		var payload []byte
		var key string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT payload, idempotency_key FROM `+db.Table("events")+` WHERE id = $1`, written[0].ID).Scan(&payload, &key))
		require.Equal(t, `{"b":1,"a":2}`, string(payload), "payload is stored byte for byte")
		require.Equal(t, written[0].EventID, key, "the idempotency key defaults to the event id")
	})

	t.Run("SingleEventStoresEveryField", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		full := event("o-1")
		full.Topic, full.ContentType, full.IdempotencyKey = "orders", "application/json", "request-7"
		full.Headers = map[string]string{"traceparent": "00-abc-01"}
		var written []producer.Written
		for _, e := range []producer.Event{full, event("o-2")} {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			ws, err := w.Write(ctx, tx, e)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			written = append(written, ws...)
		}
		type row struct {
			EventID, Key, AggType, AggID, EventType string
			Seq                                     int64
			Topic, ContentType                      *string
			Payload                                 []byte
			Headers                                 map[string]string
		}
		read := func(id int64) row {
			var r row
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT event_id::text, idempotency_key, aggregate_type, aggregate_id, event_type,
       aggregate_seq, topic, content_type, payload, headers FROM `+db.Table("events")+` WHERE id = $1`, id).
				Scan(&r.EventID, &r.Key, &r.AggType, &r.AggID, &r.EventType, &r.Seq, &r.Topic, &r.ContentType, &r.Payload, &r.Headers))
			return r
		}
		got := read(written[0].ID)
		require.Equal(t, written[0].EventID, got.EventID)
		require.Equal(t, "request-7", got.Key)
		require.Equal(t, []string{"order", "o-1", "order.created"}, []string{got.AggType, got.AggID, got.EventType})
		require.Equal(t, int64(1), got.Seq)
		require.Equal(t, "orders", *got.Topic)
		require.Equal(t, "application/json", *got.ContentType)
		require.Equal(t, `{"b":1,"a":2}`, string(got.Payload))
		require.Equal(t, map[string]string{"traceparent": "00-abc-01"}, got.Headers)

		bare := read(written[1].ID)
		require.Equal(t, written[1].EventID, bare.Key, "the idempotency key defaults to the event id")
		require.Nil(t, bare.Topic)
		require.Nil(t, bare.ContentType)
		require.Empty(t, bare.Headers)
	})

	// listen returns the relays' channel of db's schema: a function that
	// waits for its next notification and returns the payload, and one that
	// sends a marker notification of its own. Notifications arrive in
	// commit order, so whatever a write sent comes before a later marker.
	listen := func(t *testing.T, db *pgtest.DB) (next func() string, marker func()) {
		t.Helper()
		// The channel, computed by the server from the schema name.
		var channel string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT 'outbox_' || left(md5($1), 16)`, db.Schema).Scan(&channel))
		listener, err := pgx.Connect(ctx, db.Server.URL)
		require.NoError(t, err)
		t.Cleanup(func() { listener.Close(ctx) })
		_, err = listener.Exec(ctx, "LISTEN "+channel)
		require.NoError(t, err)
		next = func() string {
			t.Helper()
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			n, err := listener.WaitForNotification(wctx)
			require.NoError(t, err)
			return n.Payload
		}
		marker = func() {
			t.Helper()
			_, err := db.Pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, channel)
			require.NoError(t, err)
		}
		return next, marker
	}
	write := func(t *testing.T, w *producer.Writer, db *pgtest.DB, commit bool) {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = w.Write(ctx, tx, event("o-1"))
		require.NoError(t, err)
		if commit {
			require.NoError(t, tx.Commit(ctx))
		}
	}

	t.Run("NotifiesNobodyWithoutAnIdleRelay", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		next, marker := listen(t, db)
		write(t, w, db, true)
		marker()
		require.Equal(t, "marker", next(), "no relay is idle: nobody is notified")
	})

	// A schema of its own: a write that finds no relay idle keeps the
	// process's later writes to the schema from asking for a few
	// milliseconds, which a fast machine gets through before the next
	// write.
	t.Run("WakesAnIdleRelayOnlyOnCommit", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		next, marker := listen(t, db)
		_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("relays")+` (relay_id, idle_until) VALUES ('r1', now() + interval '1 hour')`)
		require.NoError(t, err)
		write(t, w, db, false)
		marker()
		require.Equal(t, "marker", next(), "a rolled-back write notifies nobody")
		write(t, w, db, true)
		write(t, w, db, true)
		require.Equal(t, "", next(), "a committed write wakes the idle relay")
		require.Equal(t, "", next(), "and so does the next, while the relay stays idle")
	})

	t.Run("RollbackLeavesNothing", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = w.Write(ctx, tx, event("o-1"))
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		require.Equal(t, 0, count(t, db))

		// The rolled-back sequence number is reused: sequences stay gapless.
		tx, err = db.Pool.Begin(ctx)
		require.NoError(t, err)
		written, err := w.Write(ctx, tx, event("o-1"))
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, int64(1), written[0].Seq)
	})

	t.Run("KilledConnectionLeavesNothing", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		conn, err := pgx.Connect(ctx, db.Server.URL)
		require.NoError(t, err)
		defer conn.Close(ctx)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = w.Write(ctx, tx, event("o-1"))
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, conn.PgConn().PID())
		require.NoError(t, err)
		require.Error(t, tx.Commit(ctx))
		require.Equal(t, 0, count(t, db))
	})

	concurrentWriters := func(t *testing.T, perWrite int) {
		t.Helper()
		w, db := setup(t)
		const writers, each = 8, 25
		events := make([]producer.Event, perWrite)
		for i := range events {
			events[i] = event("hot")
		}
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for range writers {
			wg.Go(func() {
				for range each {
					tx, err := db.Pool.Begin(ctx)
					if err != nil {
						errs <- err
						return
					}
					if _, err := w.Write(ctx, tx, events...); err != nil {
						_ = tx.Rollback(ctx)
						errs <- err
						return
					}
					if err := tx.Commit(ctx); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		rows, err := db.Pool.Query(ctx, `SELECT aggregate_seq FROM `+db.Table("events")+` ORDER BY id`)
		require.NoError(t, err)
		seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.Len(t, seqs, writers*each*perWrite)
		for i, s := range seqs {
			require.Equal(t, int64(i+1), s, "id order and sequence order agree, without gaps")
		}
	}
	// One event and several take different statements; both must draw ids
	// in sequence order, which is the order the relay publishes in.
	for _, perWrite := range []int{1, 2} {
		t.Run(fmt.Sprintf("ConcurrentWritersGetDenseSequencesInCommitOrder/%dPerWrite", perWrite), func(t *testing.T) {
			t.Parallel()
			concurrentWriters(t, perWrite)
		})
	}

	t.Run("RefusesBadInput", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		for _, tc := range []struct {
			name  string
			edit  func(e *producer.Event)
			field string
		}{
			{"EmptyAggregateType", func(e *producer.Event) { e.AggregateType = "" }, "AggregateType"},
			{"EmptyAggregateID", func(e *producer.Event) { e.AggregateID = "" }, "AggregateID"},
			{"EmptyEventType", func(e *producer.Event) { e.EventType = "" }, "EventType"},
			{"PayloadOverLimit", func(e *producer.Event) { e.Payload = make([]byte, 8<<10) }, "Payload"},
			{"HeadersOverLimit", func(e *producer.Event) { e.Headers = map[string]string{"big": strings.Repeat("h", 8<<10)} }, "Payload"},
			{"HeaderNameWithSpace", func(e *producer.Event) { e.Headers = map[string]string{"my header": "x"} }, "Headers"},
			{"HeaderNameEmpty", func(e *producer.Event) { e.Headers = map[string]string{"": "x"} }, "Headers"},
			{"HeaderNameReserved", func(e *producer.Event) { e.Headers = map[string]string{"outbox-event-id": "x"} }, "Headers"},
			{"HeaderNameContentType", func(e *producer.Event) { e.Headers = map[string]string{"Content-Type": "x"} }, "Headers"},
			{"HeaderNameCDCEventID", func(e *producer.Event) { e.Headers = map[string]string{"ID": "x"} }, "Headers"},
			{"HeaderValueNUL", func(e *producer.Event) { e.Headers = map[string]string{"traceparent": "a\x00b"} }, "Headers"},
			{"AggregateIDNotUTF8", func(e *producer.Event) { e.AggregateID = "\xff" }, "AggregateID"},
			{"AggregateTypeOverLimit", func(e *producer.Event) { e.AggregateType = strings.Repeat("t", outbox.MaxAggregateTypeBytes+1) }, "AggregateType"},
			{"AggregateIDOverLimit", func(e *producer.Event) { e.AggregateID = strings.Repeat("i", outbox.MaxAggregateIDBytes+1) }, "AggregateID"},
			// Too long for the sequences table's index entry, too: without
			// the limit, the statement fails with SQLSTATE 54000.
			{"AggregateIDOverIndexEntry", func(e *producer.Event) { e.AggregateID = incompressible(3000) }, "AggregateID"},
			{"IdempotencyKeyOverLimit", func(e *producer.Event) { e.IdempotencyKey = strings.Repeat("k", outbox.MaxIdempotencyKeyBytes+1) }, "IdempotencyKey"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tx, err := db.Pool.Begin(ctx)
				require.NoError(t, err)
				defer tx.Rollback(ctx)
				bad := event("o-1")
				tc.edit(&bad)
				_, err = w.Write(ctx, tx, event("o-2"), bad)
				var verr *producer.ValidationError
				require.ErrorAs(t, err, &verr)
				require.Equal(t, 1, verr.Index)
				require.Equal(t, tc.field, verr.Field)
				require.True(t, strings.HasPrefix(err.Error(), "producer: event 1: "+tc.field), err.Error())
				require.NoError(t, tx.Commit(ctx))
				require.Equal(t, 0, count(t, db), "nothing is written when one event is refused")
				var sequences int
				require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("sequences")).Scan(&sequences))
				require.Zero(t, sequences, "no sequence is bumped when one event is refused")
			})
		}
	})

	t.Run("SequencesPastInt32", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		// An aggregate whose sequence already stands just below s, as a
		// long-lived one's does after that many events.
		from := func(agg string, last int64) {
			_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("sequences")+` (aggregate_type, aggregate_id, last_seq) VALUES ('order', $1, $2)`, agg, last)
			require.NoError(t, err)
		}
		write := func(events ...producer.Event) ([]producer.Written, error) {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			written, err := w.Write(ctx, tx, events...)
			if err != nil {
				return nil, err
			}
			return written, tx.Commit(ctx)
		}
		for _, s := range []int64{1 << 31, 1 << 53, math.MaxInt64} {
			// One event, and two of one aggregate plus one of another in
			// one call: the two statements Write uses.
			single, multi := fmt.Sprintf("single-%d", s), fmt.Sprintf("multi-%d", s)
			from(single, s-1)
			from(multi, s-2)
			got, err := write(event(single))
			require.NoError(t, err, "seq %d", s)
			require.Equal(t, s, got[0].Seq)
			got, err = write(event(multi), event("fresh-"+multi), event(multi))
			require.NoError(t, err, "seq %d", s)
			require.Equal(t, []int64{s - 1, 1, s}, []int64{got[0].Seq, got[1].Seq, got[2].Seq})
		}
		var stored int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT aggregate_seq FROM `+db.Table("events")+` WHERE aggregate_id = $1`, fmt.Sprintf("single-%d", int64(math.MaxInt64))).Scan(&stored))
		require.Equal(t, int64(math.MaxInt64), stored)

		// Past the largest bigint there is no next sequence: a clear error,
		// and nothing written.
		before := count(t, db)
		for _, events := range [][]producer.Event{
			{event(fmt.Sprintf("single-%d", int64(math.MaxInt64)))},
			{event("another"), event(fmt.Sprintf("multi-%d", int64(math.MaxInt64)))},
		} {
			_, err := write(events...)
			require.ErrorIs(t, err, producer.ErrSequenceExhausted)
			require.ErrorContains(t, err, "9223372036854775807")
		}
		_, err := write(event(fmt.Sprintf("single-%d", int64(math.MaxInt64))))
		require.ErrorContains(t, err, "aggregate order/single-9223372036854775807")
		require.Equal(t, before, count(t, db))
	})

	t.Run("LengthLimitsAreInBytesAndNamed", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		write := func(e producer.Event) error {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			if _, err := w.Write(ctx, tx, e); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}
		// At their limits, in two-byte characters, the fields are written
		// and stored whole.
		atLimit := event("")
		atLimit.AggregateType = strings.Repeat("é", outbox.MaxAggregateTypeBytes/2) + "t"
		atLimit.AggregateID = strings.Repeat("é", outbox.MaxAggregateIDBytes/2)
		atLimit.IdempotencyKey = strings.Repeat("é", outbox.MaxIdempotencyKeyBytes/2)
		require.NoError(t, write(atLimit))
		var aggType, aggID, key string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT aggregate_type, aggregate_id, idempotency_key FROM `+db.Table("events")).Scan(&aggType, &aggID, &key))
		require.Equal(t, []string{atLimit.AggregateType, atLimit.AggregateID, atLimit.IdempotencyKey}, []string{aggType, aggID, key})

		// One byte more is refused, with a message that names the field,
		// its length and the limit's constant.
		for _, tc := range []struct {
			edit func(e *producer.Event)
			msg  string
		}{
			{func(e *producer.Event) { e.AggregateType += "x" }, "producer: event 0: AggregateType is 256 bytes; the limit is outbox.MaxAggregateTypeBytes (255)"},
			{func(e *producer.Event) { e.AggregateID += "x" }, "producer: event 0: AggregateID is 1025 bytes; the limit is outbox.MaxAggregateIDBytes (1024)"},
			{func(e *producer.Event) { e.AggregateID = incompressible(3000) }, "producer: event 0: AggregateID is 3000 bytes; the limit is outbox.MaxAggregateIDBytes (1024)"},
			{func(e *producer.Event) { e.IdempotencyKey += "x" }, "producer: event 0: IdempotencyKey is 1025 bytes; the limit is outbox.MaxIdempotencyKeyBytes (1024)"},
		} {
			over := atLimit
			tc.edit(&over)
			err := write(over)
			var verr *producer.ValidationError
			require.ErrorAs(t, err, &verr)
			require.EqualError(t, err, tc.msg)
		}
		require.Equal(t, 1, count(t, db))
	})

	// A finished pool transaction's connection is back in the pool and may
	// be another goroutine's: Write must refuse without touching it (the
	// race detector would see it).
	t.Run("FinishedPoolTxLeavesItsConnectionAlone", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, &pgtest.Opts{MaxConns: 1})
		w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
		finished, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, finished.Commit(ctx))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				tx, err := db.Pool.Begin(ctx) // the same connection
				if err != nil {
					return
				}
				_, _ = producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}).Write(ctx, tx, event("o-2"))
				_ = tx.Rollback(ctx)
			}
		})
		for range 200 {
			_, err := w.Write(ctx, finished, event("o-1"))
			require.ErrorIs(t, err, pgx.ErrTxClosed)
		}
		close(stop)
		wg.Wait()
	})

	t.Run("RefusesNilAndFinishedTx", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		_, err := w.Write(ctx, nil, event("o-1"))
		require.ErrorIs(t, err, producer.ErrNoTx)
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		_, err = w.Write(ctx, tx, event("o-1"))
		require.True(t, errors.Is(err, pgx.ErrTxClosed), err)
		require.Equal(t, 0, count(t, db))
	})
}

// incompressible returns n bytes of random lowercase hex, which PostgreSQL
// cannot compress below the size of an index entry.
func incompressible(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// TestWriteBurstWakesAnIdleRelay checks that a burst of concurrent writes
// wakes an idle relay for all of its events, though only one write per wake
// slot notifies: with an hour-long poll, an event that a skipped write left
// to a notification that never came would stay undelivered.
func TestWriteBurstWakesAnIdleRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBundleOn(t, kafkatest.New(t), 4, &pgtest.Opts{MaxConns: 24})
	b.startRelay(t, &producer.RelayConfig{PollInterval: time.Hour, RebalanceInterval: time.Hour})
	idle := func() bool {
		var idle bool
		_ = b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+b.db.Table("relays")+` WHERE idle_until > now())`).Scan(&idle)
		return idle
	}
	for burst := range 3 {
		waitFor(t, 30*time.Second, "relay idle", idle)
		errs := make(chan error, 16)
		for w := range 16 {
			go func() {
				for i := range 10 {
					if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
						_, err := b.writer.Write(ctx, tx, b.event(fmt.Sprintf("b%d-w%d-%d", burst, w, i%3)))
						return err
					}); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range 16 {
			require.NoError(t, <-errs)
		}
		b.waitDelivered(t, 20*time.Second)
	}
}
