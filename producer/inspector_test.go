package producer_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

func TestNewInspector(t *testing.T) {
	t.Parallel()

	t.Run("RefusesBadInput", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		_, err := producer.NewInspector(nil, db.Schema)
		require.EqualError(t, err, "producer: NewInspector: nil db; pass the pool (or conn, or tx) of the database that holds the outbox tables")
		_, err = producer.NewInspector(db.Pool, strings.Repeat("s", 64))
		require.ErrorContains(t, err, "producer: NewInspector: schema name")
		require.ErrorContains(t, err, "is 64 bytes; PostgreSQL keeps 63")
		_, err = producer.NewDeadEvents(&producer.DeadEventsConfig{Schema: strings.Repeat("s", 64)})
		require.ErrorContains(t, err, "producer: NewDeadEvents: schema name")
	})

	t.Run("EmptySchemaIsTheDefault", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		_, err := producer.NewInspector(db.Pool, "")
		require.NoError(t, err)
	})

	t.Run("ReadsThroughAnyDB", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		db := pgtest.New(t, nil)
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}).
			Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "placed", Topic: "orders"})
		require.NoError(t, err)

		// Inside the transaction its uncommitted event shows; outside it
		// does not.
		var in *producer.Inspector
		in, err = producer.NewInspector(tx, db.Schema)
		require.NoError(t, err)
		h, err := in.Health(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, h.Undelivered)
		h, err = inspector(t, db).Health(ctx)
		require.NoError(t, err)
		require.Zero(t, h.Undelivered)

		conn, err := pgx.ConnectConfig(ctx, db.Pool.Config().ConnConfig)
		require.NoError(t, err)
		defer func() { _ = conn.Close(ctx) }()
		in, err = producer.NewInspector(conn, db.Schema)
		require.NoError(t, err)
		st, err := in.Dispatch(ctx)
		require.NoError(t, err)
		require.Equal(t, producer.DispatchRelay, st.Mode)
	})

	t.Run("UnmigratedSchemaSaysSo", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		db := pgtest.New(t, nil)
		in, err := producer.NewInspector(db.Pool, "not_migrated_"+db.Schema)
		require.NoError(t, err)
		_, err = in.Health(ctx)
		require.ErrorContains(t, err, "did Migrate run?")
		_, err = in.Relays(ctx)
		require.ErrorContains(t, err, "did Migrate run?")
	})
}
