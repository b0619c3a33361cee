package outbox

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is the database handle the SDK's functions take where they do not
// need a transaction of the caller's: *pgxpool.Pool satisfies it, and so do
// *pgx.Conn and pgx.Tx (in which the SDK's transactions become savepoints).
// Functions that must run inside the caller's transaction take a pgx.Tx
// instead.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
