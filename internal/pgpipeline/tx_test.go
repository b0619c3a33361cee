package pgpipeline_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgpipeline"
	"github.com/d419a114/outbox/internal/pgtest"
)

// TestTx checks the pipelined transaction directly: its first statement's
// row, its savepoints, its own writes, its commit and rollback (each once),
// a commit the server turned into a rollback, a first statement that
// fails, and the server pid it reports. The handler's view of it is
// TestHandlerTransaction, in package consumer.
func TestTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*pgtest.DB, string) {
		t.Helper()
		db := pgtest.New(t, nil)
		table := db.Table("tx_rows")
		_, err := db.Pool.Exec(ctx, `CREATE TABLE `+table+` (v text NOT NULL)`)
		require.NoError(t, err)
		return db, table
	}
	count := func(t *testing.T, db *pgtest.DB, table string) int {
		t.Helper()
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		return n
	}

	t.Run("CommitKeepsWhatSavepointsKept", func(t *testing.T) {
		t.Parallel()
		db, table := setup(t)
		var first int
		tx, release, err := pgpipeline.Begin(ctx, db.Pool, `SELECT $1::int`, []any{7}, &first)
		require.NoError(t, err)
		defer release()
		require.Equal(t, 7, first, "the first statement's row")
		var pid uint32
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		require.Equal(t, pid, pgpipeline.ServerPID(ctx, tx), "the transaction's server pid")

		_, err = tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('kept')`)
		require.NoError(t, err)
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		_, err = sp.Exec(ctx, `INSERT INTO `+table+` VALUES ('undone')`)
		require.NoError(t, err)
		require.NoError(t, sp.Rollback(ctx))
		require.ErrorIs(t, sp.Rollback(ctx), pgx.ErrTxClosed)
		sp, err = tx.Begin(ctx)
		require.NoError(t, err)
		_, err = sp.Exec(ctx, `INSERT INTO `+table+` VALUES ('released')`)
		require.NoError(t, err)
		require.NoError(t, sp.Commit(ctx))
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		require.Equal(t, 2, n, "own writes")
		require.Zero(t, count(t, db, table), "uncommitted writes seen outside")

		require.NoError(t, tx.Commit(ctx))
		require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxClosed)
		require.ErrorIs(t, tx.Rollback(ctx), pgx.ErrTxClosed)
		_, err = tx.Exec(ctx, `SELECT 1`)
		require.ErrorIs(t, err, pgx.ErrTxClosed)
		require.Equal(t, 2, count(t, db, table))
	})

	t.Run("RollbackUndoes", func(t *testing.T) {
		t.Parallel()
		db, table := setup(t)
		var first int
		tx, release, err := pgpipeline.Begin(ctx, db.Pool, `SELECT 1`, nil, &first)
		require.NoError(t, err)
		defer release()
		_, err = tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('x')`)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxClosed)
		require.Zero(t, count(t, db, table))
	})

	t.Run("FailedStatementTurnsCommitIntoRollback", func(t *testing.T) {
		t.Parallel()
		db, table := setup(t)
		var first int
		tx, release, err := pgpipeline.Begin(ctx, db.Pool, `SELECT 1`, nil, &first)
		require.NoError(t, err)
		defer release()
		_, err = tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('x')`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT 1/0`)
		require.Error(t, err)
		require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxCommitRollback)
		require.Zero(t, count(t, db, table))
	})

	t.Run("FailedFirstStatementLeavesNoTransaction", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t)
		var first int
		_, _, err := pgpipeline.Begin(ctx, db.Pool, `SELECT 1/0`, nil, &first)
		require.Error(t, err)
		// The connection went back to the pool idle: the next one works.
		var one int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT 1`).Scan(&one))
	})
}
