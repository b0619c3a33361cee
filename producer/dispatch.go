package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/d419a114/outbox"
)

// Dispatch names who publishes a schema's events to Kafka.
type Dispatch string

const (
	// DispatchRelay is the default: a Relay polls the events table,
	// publishes what is undelivered and marks it delivered.
	DispatchRelay Dispatch = "relay"
	// DispatchCDC is change data capture: a Debezium connector reads the
	// inserts from the WAL through a logical replication slot and
	// publishes them with its outbox event router (docs/cdc.md). Events
	// are written as published, so no relay has anything to claim, Prune
	// deletes them by age, and the health view reports the slot instead
	// of an undelivered backlog.
	DispatchCDC Dispatch = "cdc"
)

// ErrCDCDispatch is returned, wrapped, by Relay.Run when the schema is
// dispatched by change data capture (DispatchCDC): a relay must not publish
// beside the connector. It is permanent until the mode changes.
var ErrCDCDispatch = errors.New("producer: the schema's events are published by change data capture, not by a relay")

// DispatchConfig tunes SetDispatch. The zero value is valid for
// DispatchRelay.
type DispatchConfig struct {
	// Schema holds the outbox tables. Default outbox.DefaultSchema.
	Schema string
	// Slot is the logical replication slot the connector reads
	// (Debezium's slot.name). Required for DispatchCDC: the slot must
	// exist, so that every event written after the switch is in its
	// stream; the health view reports its state.
	Slot string
	// Logger receives one line when the mode changes. Default
	// slog.Default().
	Logger *slog.Logger
}

// DispatchState is a schema's dispatch mode, as ReadDispatch returns it.
type DispatchState struct {
	// Mode is who publishes the schema's events.
	Mode Dispatch
	// Slot is the replication slot of DispatchCDC; "" for DispatchRelay.
	Slot string
	// ChangedAt is when the mode was last set (the migration's time if
	// never).
	ChangedAt time.Time
}

// ReadDispatch returns the dispatch mode of schema ("" means
// outbox.DefaultSchema). A schema migrated by a build before the mode
// existed (no dispatch table) is DispatchRelay.
func ReadDispatch(ctx context.Context, db outbox.DB, schema string) (DispatchState, error) {
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	var (
		st   DispatchState
		mode string
		slot *string
	)
	err := db.QueryRow(ctx, qualify(`SELECT mode, slot_name, changed_at FROM {schema}.dispatch`, schema)).Scan(&mode, &slot, &st.ChangedAt)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == sqlstateUndefinedTable:
		return DispatchState{Mode: DispatchRelay}, nil
	case err != nil:
		return DispatchState{}, fmt.Errorf("producer: read dispatch mode of schema %q (%s): %w", schema, migrateHint(err), err)
	}
	st.Mode = Dispatch(mode)
	if slot != nil {
		st.Slot = *slot
	}
	return st, nil
}

// sqlstateUndefinedTable is undefined_table.
const sqlstateUndefinedTable = "42P01"

// SetDispatch makes mode the way schema's events are published. It is an
// administrative step, like Migrate: it alters the events table, so it
// needs the table's owner, and it briefly blocks writers.
//
// Switching to DispatchCDC needs the connector's slot (cfg.Slot) to exist
// in this database and the events table to be in a publication (with
// publish_via_partition_root for the day-partitioned layout, without which
// the connector would silently see nothing). It locks the events table
// against writes, checks that no event is undelivered (every event written
// before the switch went out through the relay), and makes published_at
// default to the time of writing. Events written from then on are in the
// slot's stream and look delivered to the relay, the health view and
// Prune. With undelivered events it returns an error and changes nothing:
// start the connector first (its slot then streams every new event, and
// the relay's duplicates are absorbed by the consumers' dedupe), let the
// relay drain, and call again; a running relay stops by itself within a
// RebalanceInterval of the switch.
//
// Switching back to DispatchRelay drops the default: events written from
// then on wait for a relay. Keep the connector running until a relay runs,
// so that the events it has not streamed yet are not stranded (it sends
// them, and the relay sends the new ones; duplicates are absorbed), then
// delete the connector and drop its slot, which otherwise holds WAL back.
func SetDispatch(ctx context.Context, db outbox.DB, mode Dispatch, cfg *DispatchConfig) error {
	c := DispatchConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = outbox.DefaultSchema
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch mode {
	case DispatchRelay, DispatchCDC:
	default:
		return fmt.Errorf("producer: SetDispatch: unknown mode %q; use producer.DispatchRelay or producer.DispatchCDC", mode)
	}
	if mode == DispatchCDC && c.Slot == "" {
		return errors.New("producer: SetDispatch: DispatchCDC needs DispatchConfig.Slot, the connector's replication slot (Debezium's slot.name)")
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("producer: SetDispatch: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var current string
	if err := tx.QueryRow(ctx, qualify(`SELECT mode FROM {schema}.dispatch FOR UPDATE`, c.Schema)).Scan(&current); err != nil {
		return fmt.Errorf("producer: SetDispatch: read the mode of schema %q (run Migrate first: the mode came with migration 0008): %w", c.Schema, err)
	}
	if mode == DispatchCDC {
		if err := checkCDCReady(ctx, tx, c.Schema, c.Slot); err != nil {
			return err
		}
	}
	stmt := `ALTER TABLE {schema}.events ALTER COLUMN published_at DROP DEFAULT`
	slot := any(nil)
	if mode == DispatchCDC {
		stmt = `ALTER TABLE {schema}.events ALTER COLUMN published_at SET DEFAULT now()`
		slot = c.Slot
	}
	if _, err := tx.Exec(ctx, qualify(stmt, c.Schema)); err != nil {
		return fmt.Errorf("producer: SetDispatch: set the default of published_at (needs the events table's owner): %w", err)
	}
	if _, err := tx.Exec(ctx, qualify(`UPDATE {schema}.dispatch SET mode = $1, slot_name = $2, changed_at = now()`, c.Schema), string(mode), slot); err != nil {
		return fmt.Errorf("producer: SetDispatch: record the mode: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("producer: SetDispatch: commit: %w", err)
	}
	c.Logger.InfoContext(ctx, "producer: dispatch mode set", slog.String("schema", c.Schema),
		slog.String("from", current), slog.String("to", string(mode)), slog.String("slot", c.Slot))
	return nil
}

// checkCDCReady checks, inside SetDispatch's transaction, what the switch
// to CDC needs, and takes the lock that keeps new undelivered events out
// until the switch commits. EXCLUSIVE mode lets readers on and blocks
// every write, the relay's marks included; the count uses the partial
// index of undelivered events.
func checkCDCReady(ctx context.Context, tx pgx.Tx, schema, slot string) error {
	var plugin *string
	var found bool
	err := tx.QueryRow(ctx, `SELECT true, plugin FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, slot).Scan(&found, &plugin)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("producer: SetDispatch: no replication slot %q in this database; start the connector first (Debezium creates slot.name on its first start) or create it with SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", slot, slot)
	}
	if err != nil {
		return fmt.Errorf("producer: SetDispatch: look up replication slot %q: %w", slot, err)
	}
	if plugin == nil || *plugin != "pgoutput" {
		p := "none (a physical slot)"
		if plugin != nil {
			p = *plugin
		}
		return fmt.Errorf("producer: SetDispatch: replication slot %q uses plugin %s; the tested configuration uses pgoutput (Debezium's plugin.name=pgoutput)", slot, p)
	}
	var published, viaRoot, partitioned bool
	err = tx.QueryRow(ctx, `
SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE schemaname = $1 AND tablename = 'events'),
       coalesce((SELECT bool_or(p.pubviaroot) FROM pg_publication p
                 JOIN pg_publication_tables t ON t.pubname = p.pubname
                 WHERE t.schemaname = $1 AND t.tablename = 'events'), false),
       (SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($2))`,
		schema, qualify("{schema}.events", schema)).Scan(&published, &viaRoot, &partitioned)
	if err != nil {
		return fmt.Errorf("producer: SetDispatch: look up the publication of the events table: %w", err)
	}
	events := qualify("{schema}.events", schema)
	switch {
	case !published && partitioned:
		return fmt.Errorf("producer: SetDispatch: the events table is in no publication as itself; a day-partitioned table needs publish_via_partition_root, or pgoutput reports its partitions and the connector captures nothing: CREATE PUBLICATION outbox_cdc FOR TABLE %s WITH (publish_via_partition_root = true)", events)
	case !published:
		return fmt.Errorf("producer: SetDispatch: the events table is in no publication, so the connector would capture nothing: CREATE PUBLICATION outbox_cdc FOR TABLE %s (and name it in Debezium's publication.name)", events)
	case partitioned && !viaRoot:
		return fmt.Errorf("producer: SetDispatch: the publication of the day-partitioned events table lacks publish_via_partition_root, so pgoutput reports the partitions and the connector captures nothing: ALTER PUBLICATION ... SET (publish_via_partition_root = true)")
	}
	if _, err := tx.Exec(ctx, qualify(`LOCK TABLE {schema}.events IN EXCLUSIVE MODE`, schema)); err != nil {
		return fmt.Errorf("producer: SetDispatch: lock the events table: %w", err)
	}
	var undelivered int64
	if err := tx.QueryRow(ctx, qualify(`SELECT count(*) FROM {schema}.events WHERE published_at IS NULL`, schema)).Scan(&undelivered); err != nil {
		return fmt.Errorf("producer: SetDispatch: count undelivered events: %w", err)
	}
	if undelivered > 0 {
		return fmt.Errorf("producer: SetDispatch: %d events are undelivered and would never be published after the switch; with the connector streaming, let the relay deliver them (producer.ReadHealth says when Undelivered is 0) and call again", undelivered)
	}
	return nil
}
