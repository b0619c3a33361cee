package move

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
)

// Record is one shard's side of a move, as List reads it.
type Record struct {
	ID string
	// Out is true on the move's source, where the aggregates left, and
	// false on its target.
	Out bool
	// Peer names the other shard.
	Peer  string
	State State
	// Aggregates is how many aggregates the move takes.
	Aggregates int
	// StartedAt is when this shard first recorded the move, UpdatedAt
	// when its state last changed here.
	StartedAt, UpdatedAt time.Time
}

// MaxList bounds List's limit.
const MaxList = 10_000

// List returns the moves recorded in schema (default
// outbox.DefaultSchema) on one shard, the most recently updated first
// (ties: the greater ID first), at most limit of them (default 100, at
// most MaxList). A move between two shards of one database appears twice,
// once on each side. It reads the rows of the moves it returns, not the
// whole table.
func List(ctx context.Context, db outbox.DB, schema string, limit int) ([]Record, error) {
	sql, err := statementsFor(schema)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, MaxList)
	rows, err := db.Query(ctx, sql.List, limit)
	if err != nil {
		return nil, fmt.Errorf("move: list moves: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var (
			r   Record
			dir string
		)
		err := row.Scan(&r.ID, &dir, &r.Peer, &r.State, &r.Aggregates, &r.StartedAt, &r.UpdatedAt)
		r.Out = dir == "out"
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("move: list moves: %w", err)
	}
	return out, nil
}
