package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// TestOverLongSchemaNamesAreRefused: PostgreSQL cuts an identifier to 63
// bytes without an error, so a longer schema name would silently name
// another schema; every entry point that takes one refuses it.
func TestOverLongSchemaNamesAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	// A schema of 63 bytes exists; the long name is it and one byte more.
	kept := db.Schema + strings.Repeat("x", 63-len(db.Schema))
	_, err := outbox.Migrate(ctx, db.Pool, &outbox.MigrateConfig{Schema: kept})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{kept}.Sanitize()+` CASCADE`)
	})
	long := kept + "y"
	_, err = outbox.Migrate(ctx, db.Pool, &outbox.MigrateConfig{Schema: long})
	require.ErrorContains(t, err, "PostgreSQL keeps 63")
	_, err = consumer.Handle(db.Pool, "svc", consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		&consumer.Config{Schema: long})
	require.ErrorContains(t, err, "PostgreSQL keeps 63")
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := producer.NewWriter(&producer.WriterConfig{Schema: long}).Write(ctx, tx,
			producer.Event{AggregateType: "order", AggregateID: "1", EventType: "placed", Payload: []byte("{}")})
		return err
	})
	require.ErrorContains(t, err, "PostgreSQL keeps 63")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{kept, "events"}.Sanitize()).Scan(&n))
	require.Zero(t, n, "nothing written to the schema the long name would have been cut to")
}
