package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
)

// guard wraps a handler and records in the database every execution that
// overlaps another of the same aggregate, in this process or any other: on
// entry an execution takes its aggregate's row in a table keyed by
// aggregate, and one that finds the row taken writes an overlap row naming
// both records. Since a record belongs to one aggregate, no overlap also
// means no record was ever in two handlers at once. The guard has a pool
// of its own, so it never waits for a connection a handler holds.
type guard struct {
	pool                *pgxpool.Pool
	running, overlapped string // tables
	next                consumer.Handler
	// hold is how long an execution of a message holds its aggregate
	// before it runs next, to widen the window in which executions could
	// overlap; nil holds none.
	hold func(*consumer.Message) time.Duration
	// lost holds the errors of rows leave could not give back.
	lost chan error
}

func newGuard(t *testing.T, db *pgtest.DB, next consumer.Handler) *guard {
	t.Helper()
	ctx := context.Background()
	cfg := db.Pool.Config().Copy()
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	g := &guard{pool: pool, running: db.Table("guard_running"), overlapped: db.Table("guard_overlaps"), next: next, lost: make(chan error, 1)}
	_, err = pool.Exec(ctx, `CREATE TABLE `+g.running+` (aggregate text PRIMARY KEY, record text NOT NULL);
CREATE TABLE `+g.overlapped+` (aggregate text NOT NULL, record text NOT NULL, other text)`)
	require.NoError(t, err)
	return g
}

func (g *guard) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	held, err := g.enter(ctx, m)
	defer g.leave(ctx, held)
	if err != nil {
		return err
	}
	g.wait(m)
	return g.next.Handle(ctx, tx, m)
}

// enter takes the rows of ms's aggregates (a batch's records of one
// aggregate are one execution of it) and returns the ones it took, for
// leave; an aggregate whose row was taken is written as an overlap.
func (g *guard) enter(ctx context.Context, ms ...*consumer.Message) ([]string, error) {
	var held []string
	for _, m := range ms {
		if slices.Contains(held, m.AggregateID) {
			continue
		}
		id := fmt.Sprintf("%s/%d@%d", m.Topic, m.Partition, m.Offset)
		tag, err := g.pool.Exec(ctx, `INSERT INTO `+g.running+` VALUES ($1, $2) ON CONFLICT DO NOTHING`, m.AggregateID, id)
		if err != nil {
			return held, err
		}
		if tag.RowsAffected() == 1 {
			held = append(held, m.AggregateID)
			continue
		}
		_, err = g.pool.Exec(ctx, `INSERT INTO `+g.overlapped+` SELECT $1, $2, (SELECT record FROM `+g.running+` WHERE aggregate = $1)`, m.AggregateID, id)
		if err != nil {
			return held, err
		}
	}
	return held, nil
}

// wait holds the longest hold of ms.
func (g *guard) wait(ms ...*consumer.Message) {
	if g.hold == nil {
		return
	}
	var d time.Duration
	for _, m := range ms {
		d = max(d, g.hold(m))
	}
	time.Sleep(d)
}

// leave gives back the rows enter took, whatever became of ctx.
func (g *guard) leave(ctx context.Context, held []string) {
	if len(held) == 0 {
		return
	}
	_, err := g.pool.Exec(context.WithoutCancel(ctx), `DELETE FROM `+g.running+` WHERE aggregate = ANY($1)`, held)
	if err != nil {
		select {
		case g.lost <- fmt.Errorf("guard: give back %v: %w", held, err):
		default:
		}
	}
}

// overlaps returns the overlapping executions recorded.
func (g *guard) overlaps(t *testing.T) []string {
	t.Helper()
	select {
	case err := <-g.lost:
		require.NoError(t, err)
	default:
	}
	rows, err := g.pool.Query(context.Background(), `SELECT format('%s: %s while %s', aggregate, record, other) FROM `+g.overlapped)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// batchGuard is guard for a next that is a BatchHandler.
type batchGuard struct{ *guard }

func (g batchGuard) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	held, err := g.enter(ctx, ms...)
	defer g.leave(ctx, held)
	if err != nil {
		return err
	}
	g.wait(ms...)
	return g.next.(consumer.BatchHandler).HandleBatch(ctx, tx, ms)
}
