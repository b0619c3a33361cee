package producer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
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

// instancesSQL reads the relays table with each row's bucket locks from
// pg_locks: advisory locks on two int4 keys show the first key as classid
// (its bits as an unsigned oid, $1) and the bucket as objid, objsubid 2.
// At most $2 rows; a schema has one row per running instance.
const instancesSQL = `
SELECT r.relay_id, r.heartbeat_at, coalesce(r.idle_until > now(), false),
       r.session_pid IS NOT NULL AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = r.session_pid),
       coalesce((SELECT array_agg(l.objid::int8::int4 ORDER BY l.objid::int8) FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.granted AND l.pid = r.session_pid
                   AND l.objsubid = 2 AND l.classid::int8 = $1), '{}')
FROM {schema}.relays r
ORDER BY r.relay_id
LIMIT $2`

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
	rows, err := db.Query(ctx, qualify(instancesSQL, schema), classid, maxInstances)
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
