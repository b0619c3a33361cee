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
// the key claim; it must still behave as a pgx.Tx in full.
func TestHandlerTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	table := db.Table("tx_effects")
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+table+` (v text NOT NULL)`)
	require.NoError(t, err)
	count := func(t *testing.T) int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		return n
	}
	process := func(t *testing.T, h consumer.HandlerFunc, key string) (consumer.Result, error) {
		p, err := consumer.Handle(db.Pool, "svc-"+key, h, fastConfig(db, 1))
		require.NoError(t, err)
		r := rec("o", 1, key)
		r.Topic, r.Offset = "t", nextOffset.Add(1)
		return p.Process(ctx, r)
	}

	t.Run("EverythingAPgxTxOffers", func(t *testing.T) {
		res, err := process(t, func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
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
		}, "all")
		require.NoError(t, err)
		require.Equal(t, consumer.Applied, res.Outcome)
		require.Equal(t, 2, count(t))
	})

	t.Run("HandlerErrorRollsBackEverything", func(t *testing.T) {
		before := count(t)
		res, err := process(t, func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('never')`); err != nil {
				return err
			}
			return consumer.Permanent(errors.New("no"))
		}, "err")
		require.NoError(t, err)
		require.Equal(t, consumer.DeadLettered, res.Outcome)
		require.Equal(t, before, count(t))
	})

	t.Run("FailedStatementInHandlerRollsBack", func(t *testing.T) {
		before := count(t)
		res, err := process(t, func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
			_, _ = tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('x')`)
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // ignored error: the commit must not pretend
			return nil
		}, "abort")
		require.NoError(t, err)
		require.Equal(t, consumer.DeadLettered, res.Outcome)
		require.ErrorIs(t, res.Err, pgx.ErrTxCommitRollback)
		require.Equal(t, before, count(t))
	})
}
