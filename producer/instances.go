package producer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
)

// Instance is one relay instance as the database sees it: its row in the
// relays table and the bucket locks its session holds.
type Instance struct {
	// RelayID names the instance (RelayConfig.RelayID).
	RelayID string
	// HeartbeatAt is when it last renewed its row.
	HeartbeatAt time.Time
	// Live reports whether the session holding its bucket locks still
	// exists. A row without a session (a relay from before migration 0006,
	// or one between sessions) is not live.
	Live bool
	// Idle reports whether it last said it had nothing to do.
	Idle bool
	// Buckets are the buckets (0 to 63) whose locks its session holds,
	// ascending.
	Buckets []int32
}

// maxInstances bounds Instances; 64 buckets make more than 64 working
// instances impossible.
const maxInstances = 1000

// Instances lists the relay instances of schema ("" means
// outbox.DefaultSchema) known to the relays table, by RelayID, with the
// buckets each holds now; for a dashboard. Rows of instances that died
// stay until a live relay sweeps them (ten rebalance intervals), shown
// with Live false and no buckets.
func Instances(ctx context.Context, db outbox.DB, schema string) ([]Instance, error) {
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	classid := int64(uint32(schemaLockKey(schema))) //nolint:gosec // the key's bits as pg_locks shows them: wrapping is the point
	rows, err := db.Query(ctx, tables.ProducerFor(schema).Health.Instances, classid, maxInstances)
	if err != nil {
		return nil, fmt.Errorf("producer: list relay instances (%s): %w", migrateHint(err), err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Instance, error) {
		var in Instance
		err := r.Scan(&in.RelayID, &in.HeartbeatAt, &in.Idle, &in.Live, &in.Buckets)
		return in, err
	})
	if err != nil {
		return nil, fmt.Errorf("producer: list relay instances: %w", err)
	}
	return list, nil
}
