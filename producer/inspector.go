package producer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/tables"
)

// Inspector reads the state of one schema's producer tables: what an
// operator, a dashboard or a monitoring agent asks. It only reads; the
// verbs on dead events are DeadEvents', and the relay's own account of its
// work is [Relay.Health]. It is safe for concurrent use when its DB is (a
// pool is; a pgx.Conn or pgx.Tx is not).
type Inspector struct {
	db     outbox.DB
	schema string
	sql    *tables.Producer
}

// NewInspector returns the Inspector of schema ("" means
// outbox.DefaultSchema) in db: a *pgxpool.Pool, or a *pgx.Conn or pgx.Tx
// for reads inside one session or transaction. It reads nothing yet, so a
// schema that is not migrated shows in the first read's error. It refuses a
// nil db and a schema name longer than PostgreSQL keeps.
func NewInspector(db outbox.DB, schema string) (*Inspector, error) {
	if db == nil {
		return nil, errors.New("producer: NewInspector: nil db; pass the pool (or conn, or tx) of the database that holds the outbox tables")
	}
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	if err := tables.CheckSchema(schema); err != nil {
		return nil, fmt.Errorf("producer: NewInspector: %w", err)
	}
	return &Inspector{db: db, schema: schema, sql: tables.ProducerFor(schema)}, nil
}

// Health reads the schema's health view. The same numbers are one SELECT
// away for a monitoring agent: SELECT * FROM outbox.health.
func (in *Inspector) Health(ctx context.Context) (Health, error) {
	var (
		h                Health
		oldest           float64
		mode             string
		slot             *string
		retained, lagged *int64
	)
	sql := in.sql.Health
	err := in.db.QueryRow(ctx, sql.Read).
		Scan(&h.Undelivered, &oldest, &h.Dead, &mode, &slot, &h.CDCSlotActive, &retained, &lagged)
	if err != nil {
		return Health{}, fmt.Errorf("producer: read health of schema %q (%s): %w", in.schema, migrateHint(err), err)
	}
	h.OldestUndelivered = time.Duration(oldest * float64(time.Second))
	if h.Undelivered > 0 {
		err := in.db.QueryRow(ctx, sql.OldestError).Scan(&h.OldestUndeliveredError)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return Health{}, fmt.Errorf("producer: read health: last error of the oldest undelivered event: %w", err)
		}
	}
	h.Dispatch = Dispatch(mode)
	if slot != nil {
		h.CDCSlot = *slot
	}
	if h.Dispatch == DispatchCDC {
		if err := in.db.QueryRow(ctx, sql.SlotExists, h.CDCSlot).Scan(&h.CDCSlotExists); err != nil {
			return Health{}, fmt.Errorf("producer: read health: look up slot %q: %w", h.CDCSlot, err)
		}
	}
	if retained != nil {
		h.CDCRetainedWALBytes = *retained
	}
	if lagged != nil {
		h.CDCLagBytes = *lagged
	}
	return h, nil
}

// Dispatch reads the schema's dispatch mode (SetDispatch sets it). A
// schema migrated by a build before the mode existed (no dispatch table)
// is DispatchRelay.
func (in *Inspector) Dispatch(ctx context.Context) (DispatchState, error) {
	return readDispatch(ctx, in.db, in.sql.Dispatch, in.schema)
}

// Relays lists the relay instances known to the schema's relays table, by
// RelayID, with the buckets each holds now. Rows of instances that died
// stay until a live relay sweeps them (ten rebalance intervals), shown with
// Live false and no buckets.
func (in *Inspector) Relays(ctx context.Context) ([]RelayInstance, error) {
	classid := int64(uint32(schemaLockKey(in.schema))) //nolint:gosec // the key's bits as pg_locks shows them: wrapping is the point
	rows, err := in.db.Query(ctx, in.sql.Health.Instances, classid, maxRelays)
	if err != nil {
		return nil, fmt.Errorf("producer: list relay instances of schema %q (%s): %w", in.schema, migrateHint(err), err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RelayInstance, error) {
		var ri RelayInstance
		err := r.Scan(&ri.RelayID, &ri.HeartbeatAt, &ri.Idle, &ri.Live, &ri.Buckets)
		return ri, err
	})
	if err != nil {
		return nil, fmt.Errorf("producer: list relay instances: %w", err)
	}
	return list, nil
}

// DeadEvents returns one page of the dead events that opts (nil: all)
// matches, in id order. It takes the consumer's filter,
// deadletter.ListOpts, and of it only Status, AggregateType, AggregateID,
// AfterID and Limit (default 100) and Brief; a filter on another field is
// refused with an error, not ignored. The next page starts after the last
// event's ID (ListOpts.AfterID). Brief reads only the first 256 bytes of
// each payload ([DeadEvent.PayloadSize] keeps its whole size) and of its
// error, and no headers: a page's memory is then bounded whatever the
// events hold.
func (in *Inspector) DeadEvents(ctx context.Context, opts *deadletter.ListOpts) ([]DeadEvent, error) {
	return listDead(ctx, in.db, in.sql.DeadEvents, opts)
}

// DeadEvent returns dead event id whole, whatever its status, or an error
// wrapping outbox.ErrNotFound.
func (in *Inspector) DeadEvent(ctx context.Context, id int64) (*DeadEvent, error) {
	return findDead(ctx, in.db, in.sql.DeadEvents, id, false)
}
