package pgpipeline

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// directKey is the pgconn.PgConn CustomData key of a connection's verdict:
// whether the server pid it was given at start-up is the one its
// statements run in (true: a direct connection) or not (false: a pooler's
// client, where each transaction may run in another server session).
const directKey = "outbox.consumer.direct"

// isDirect returns a connection's verdict and whether there is one yet.
// Only the goroutine holding the connection calls it.
func isDirect(pg *pgconn.PgConn) (direct, known bool) {
	direct, known = pg.CustomData()[directKey].(bool)
	return direct, known
}

// learnDirect records the verdict for pg from serverPID, the pid a
// transaction on it read with pg_backend_pid().
func learnDirect(pg *pgconn.PgConn, serverPID uint32) {
	pg.CustomData()[directKey] = serverPID == pg.PID()
}

// ServerPID returns the server pid of tx's transaction, for ending its
// session if the transaction is abandoned: the pid that Begin read in
// its pipeline, or the start-up pid of a connection known to be direct, or
// else pg_backend_pid() asked in the transaction (a round trip, once per
// connection when it is direct, and per transaction behind a pooler). 0
// when it cannot be read.
func ServerPID(ctx context.Context, tx pgx.Tx) uint32 {
	if ptx, ok := tx.(*Tx); ok && ptx.serverPID != 0 {
		return ptx.serverPID
	}
	pg := tx.Conn().PgConn()
	if direct, _ := isDirect(pg); direct {
		return pg.PID()
	}
	var pid uint32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return 0
	}
	learnDirect(pg, pid)
	return pid
}
