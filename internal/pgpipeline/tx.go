// Package pgpipeline begins a PostgreSQL transaction in one round trip
// with its first statement, and tells the server session a transaction
// runs in, for ending it when the transaction is abandoned. The consumer's
// hot path begins each record's transaction with it.
package pgpipeline

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tx is a pgx.Tx whose BEGIN went to the server in one pipeline
// with the transaction's first statement. pgx's own Tx always spends a
// round trip on BEGIN alone, and at one record per transaction a round trip
// costs about as much as the record's own work (see BenchmarkThroughput).
//
// It behaves as pgx's Tx does: Begin opens a savepoint, Commit and Rollback
// end the transaction and are safe to call again (ErrTxClosed), and a
// failed commit reports pgx.ErrTxCommitRollback. The goroutine that runs
// the record owns it.
type Tx struct {
	conn *pgx.Conn
	// serverPID is the server session the transaction runs in (see
	// ServerPID); 0 when unknown.
	serverPID  uint32
	closed     bool
	savepoints int
	// lo is a pgx Tx on the same connection, made on first use of
	// LargeObjects only, because pgx.LargeObjects can only be had from one.
	lo pgx.Tx
}

var _ pgx.Tx = (*Tx)(nil)

// Begin opens a savepoint, a pseudo nested transaction.
func (tx *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	tx.savepoints++
	name := "outbox_sp_" + strconv.Itoa(tx.savepoints)
	if _, err := tx.conn.Exec(ctx, "savepoint "+name); err != nil {
		return nil, err
	}
	return &savepointTx{Tx: tx, name: name}, nil
}

// Commit commits the transaction; when the server rolled it back instead
// (a statement in it failed), it returns pgx.ErrTxCommitRollback.
func (tx *Tx) Commit(ctx context.Context) error {
	if tx.closed {
		return pgx.ErrTxClosed
	}
	tag, err := tx.conn.Exec(ctx, "commit")
	tx.closed = true
	if err != nil {
		if tx.conn.PgConn().TxStatus() != 'I' {
			_ = tx.conn.Close(ctx) // the pool must not reuse a connection mid-transaction
		}
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// Rollback rolls the transaction back.
func (tx *Tx) Rollback(ctx context.Context) error {
	if tx.closed {
		return pgx.ErrTxClosed
	}
	_, err := tx.conn.Exec(ctx, "rollback")
	tx.closed = true
	if err != nil {
		_ = tx.conn.Close(ctx)
		return err
	}
	return nil
}

// CopyFrom runs COPY FROM in the transaction.
func (tx *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if tx.closed {
		return 0, pgx.ErrTxClosed
	}
	return tx.conn.CopyFrom(ctx, table, columns, src)
}

// SendBatch sends b in the transaction.
func (tx *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return tx.conn.SendBatch(ctx, b)
}

// LargeObjects returns pgx's large-object API on this transaction. pgx only
// hands it out from its own Tx, so the first call opens one on the same
// connection (the server notes that a transaction is already in progress
// and carries on); its commit and rollback are never used.
func (tx *Tx) LargeObjects() pgx.LargeObjects {
	if tx.lo == nil {
		lo, err := tx.conn.Begin(context.Background())
		if err != nil {
			return pgx.LargeObjects{}
		}
		tx.lo = lo
	}
	return tx.lo.LargeObjects()
}

// Prepare prepares a statement on the transaction's connection.
func (tx *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	return tx.conn.Prepare(ctx, name, sql)
}

// Exec runs a statement in the transaction.
func (tx *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if tx.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return tx.conn.Exec(ctx, sql, args...)
}

// Query runs a query in the transaction.
func (tx *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	return tx.conn.Query(ctx, sql, args...)
}

// QueryRow runs a query in the transaction; its error surfaces at Scan.
func (tx *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, _ := tx.Query(ctx, sql, args...)
	return rowFrom{rows}
}

// Conn returns the transaction's connection.
func (tx *Tx) Conn() *pgx.Conn { return tx.conn }

// savepointTx is a pseudo nested transaction of a Tx.
type savepointTx struct {
	*Tx
	name   string
	closed bool
}

func (sp *savepointTx) Commit(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	sp.closed = true
	_, err := sp.Exec(ctx, "release savepoint "+sp.name)
	return err
}

func (sp *savepointTx) Rollback(ctx context.Context) error {
	if sp.closed {
		return pgx.ErrTxClosed
	}
	sp.closed = true
	_, err := sp.Exec(ctx, "rollback to savepoint "+sp.name)
	return err
}

// rowFrom is pgx's QueryRow result over Rows: errors surface at Scan.
type rowFrom struct{ rows pgx.Rows }

func (r rowFrom) Scan(dest ...any) error {
	if r.rows == nil {
		return pgx.ErrTxClosed
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// Pool hands out connections of their own: *pgxpool.Pool satisfies it.
type Pool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Begin acquires a connection from pool and sends BEGIN and the
// statement sql in one pipeline, scanning the statement's one row into
// dest. On success the caller owns the returned transaction and must call
// release after ending it.
//
// The transaction's server pid goes in the same pipeline, costing no
// round trip, on a connection not yet known to be direct: behind a pooler
// the connection's start-up pid is the pooler's, and each transaction may
// run in another server session (see ServerPID).
func Begin(ctx context.Context, pool Pool, sql string, args []any, dest ...any) (*Tx, func(), error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("consumer: acquire connection: %w", err)
	}
	pg := conn.Conn().PgConn()
	direct, known := isDirect(pg)
	var b pgx.Batch
	b.Queue("begin")
	b.Queue(sql, args...)
	if !direct {
		b.Queue("SELECT pg_backend_pid()")
	}
	br := conn.SendBatch(ctx, &b)
	_, err = br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	var pid uint32
	if err == nil && !direct {
		err = br.QueryRow().Scan(&pid)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	tx := &Tx{conn: conn.Conn(), serverPID: pg.PID()}
	if !direct {
		tx.serverPID = pid
		if !known && err == nil {
			learnDirect(pg, pid)
		}
	}
	if err != nil {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
		conn.Release()
		return nil, nil, err
	}
	return tx, conn.Release, nil
}
