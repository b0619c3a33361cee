package producer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

func TestWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setup := func(t *testing.T) (*producer.Writer, *pgtest.DB) {
		t.Helper()
		db := pgtest.New(t, nil)
		return producer.NewWriter(&producer.WriterConfig{Schema: db.Schema, MaxPayloadBytes: 64}), db
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

	t.Run("ConcurrentWritersGetDenseSequencesInCommitOrder", func(t *testing.T) {
		t.Parallel()
		w, db := setup(t)
		const writers, each = 8, 25
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
					if _, err := w.Write(ctx, tx, event("hot"), event("hot")); err != nil {
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
		require.Len(t, seqs, writers*each*2)
		for i, s := range seqs {
			require.Equal(t, int64(i+1), s, "id order and sequence order agree, without gaps")
		}
	})

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
			{"PayloadOverLimit", func(e *producer.Event) { e.Payload = make([]byte, 65) }, "Payload"},
			{"HeaderNameWithSpace", func(e *producer.Event) { e.Headers = map[string]string{"my header": "x"} }, "Headers"},
			{"HeaderNameEmpty", func(e *producer.Event) { e.Headers = map[string]string{"": "x"} }, "Headers"},
			{"HeaderNameReserved", func(e *producer.Event) { e.Headers = map[string]string{"outbox-event-id": "x"} }, "Headers"},
			{"HeaderNameContentType", func(e *producer.Event) { e.Headers = map[string]string{"Content-Type": "x"} }, "Headers"},
			{"HeaderValueNUL", func(e *producer.Event) { e.Headers = map[string]string{"traceparent": "a\x00b"} }, "Headers"},
			{"AggregateIDNotUTF8", func(e *producer.Event) { e.AggregateID = "\xff" }, "AggregateID"},
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
			})
		}
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
