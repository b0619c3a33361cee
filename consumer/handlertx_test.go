package consumer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
)

// On a pool, the transaction a handler gets has its BEGIN pipelined with
// the key claim (internal/pgpipeline); it must still behave as a pgx.Tx in
// full.
func TestHandlerTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type bundle struct {
		db    *pgtest.DB
		table string
	}
	setup := func(t *testing.T) *bundle {
		t.Helper()
		b := &bundle{db: pgtest.New(t, nil)}
		b.table = b.db.Table("tx_effects")
		_, err := b.db.Pool.Exec(ctx, `CREATE TABLE `+b.table+` (v text NOT NULL)`)
		require.NoError(t, err)
		return b
	}
	count := func(t *testing.T, b *bundle) int {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.table).Scan(&n))
		return n
	}
	process := func(t *testing.T, b *bundle, h consumer.HandlerFunc) (consumer.Result, error) {
		p, err := consumer.Handle(b.db.Pool, "svc", h, fastConfig(b.db, 1))
		require.NoError(t, err)
		r := rec("o", 1, "k")
		r.Topic, r.Offset = "t", nextOffset.Add(1)
		return p.Process(ctx, r)
	}

	t.Run("EverythingAPgxTxOffers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		db, table := b.db, b.table
		res, err := process(t, b, func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
			inner, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := inner.Exec(ctx, `INSERT INTO `+table+` VALUES ('rolled back')`); err != nil {
				return err
			}
			if err := inner.Rollback(ctx); err != nil {
				return err
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{db.Schema, "tx_effects"}, []string{"v"}, pgx.CopyFromRows([][]any{{"copied"}})); err != nil {
				return err
			}
			var b pgx.Batch
			b.Queue(`INSERT INTO ` + table + ` VALUES ('batched')`)
			if err := tx.SendBatch(ctx, &b).Close(); err != nil {
				return err
			}
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 2 {
				return errors.Join(err, errors.New("own writes not visible"))
			}
			lo := tx.LargeObjects()
			oid, err := lo.Create(ctx, 0)
			if err != nil {
				return err
			}
			obj, err := lo.Open(ctx, oid, pgx.LargeObjectModeWrite)
			if err != nil {
				return err
			}
			_, err = obj.Write([]byte("large"))
			return err
		})
		require.NoError(t, err)
		require.Equal(t, consumer.Applied, res.Outcome)
		require.Equal(t, 2, count(t, b))
	})

	t.Run("HandlerErrorRollsBackEverything", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		table := b.table
		res, err := process(t, b, func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('never')`); err != nil {
				return err
			}
			return consumer.Permanent(errors.New("no"))
		})
		require.NoError(t, err)
		require.Equal(t, consumer.DeadLettered, res.Outcome)
		require.Zero(t, count(t, b))
	})

	t.Run("FailedStatementInHandlerRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		table := b.table
		res, err := process(t, b, func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
			_, _ = tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('x')`)
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // ignored error: the commit must not pretend
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, consumer.DeadLettered, res.Outcome)
		require.ErrorIs(t, res.Err, pgx.ErrTxCommitRollback)
		require.Zero(t, count(t, b))
	})
}
