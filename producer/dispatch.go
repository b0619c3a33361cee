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
	"github.com/d419a114/outbox/internal/tables"
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

// ErrCDCDispatch is returned, wrapped, by [Relay.Run] when the schema is
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
	// Wait makes a switch back to DispatchRelay wait, until ctx ends, for
	// the connector to stream what was written in CDC mode, instead of
	// returning a *SlotLagError at once. Default false.
	Wait bool
	// MaxWriterBlock bounds how long one attempt of a waiting switch back
	// holds writers off while it waits for the slot's last confirmation;
	// then it lets them on, waits for the connector again and retries.
	// Set it above the Connect worker's offset.flush.interval.ms (Debezium
	// confirms its position when Connect commits offsets). Default 5s.
	MaxWriterBlock time.Duration
	// SkipSlotCheck switches back to DispatchRelay without asking the slot
	// whether the connector streamed every event written in CDC mode: for
	// a slot that is gone. Events it had not streamed are never published.
	// Default false.
	SkipSlotCheck bool
	// Logger receives one line when the mode changes. Default
	// slog.Default().
	Logger *slog.Logger
}

// SlotLagError is returned by SetDispatch when a switch back to
// DispatchRelay finds events written in CDC mode that the connector has
// not streamed yet: a relay publishing newer events of their aggregates
// before them would reorder the topic. Nothing changed. It is retryable:
// keep the connector running and call again, or set [DispatchConfig.Wait].
type SlotLagError struct {
	// Slot is the connector's replication slot.
	Slot string
	// Pending is how many events the slot has not confirmed.
	Pending int64
	// LagBytes is how far the slot's confirmed position is behind the
	// switch point, in bytes of WAL.
	LagBytes int64
}

func (e *SlotLagError) Error() string {
	return fmt.Sprintf("producer: SetDispatch: replication slot %q has not confirmed %d events written in CDC mode (%d bytes of WAL behind the switch point); a relay would publish newer events before them. Keep the connector running and call again, or set DispatchConfig.Wait with a ctx deadline to wait for it; Debezium confirms an event only after it sends a later record, so give it heartbeat.interval.ms (docs/cdc.md)",
		e.Slot, e.Pending, e.LagBytes)
}

// DispatchState is a schema's dispatch mode, as [Inspector.Dispatch] reads
// it.
type DispatchState struct {
	// Mode is who publishes the schema's events.
	Mode Dispatch
	// Slot is the replication slot of DispatchCDC; "" for DispatchRelay.
	Slot string
	// ChangedAt is when the mode was last set (the migration's time if
	// never).
	ChangedAt time.Time
}

// readDispatch reads the dispatch mode of schema with sql, for
// [Inspector.Dispatch] and the relay. A schema migrated by a build before
// the mode existed (no dispatch table) is DispatchRelay.
func readDispatch(ctx context.Context, db outbox.DB, sql tables.Dispatch, schema string) (DispatchState, error) {
	var (
		st   DispatchState
		mode string
		slot *string
	)
	err := db.QueryRow(ctx, sql.Read).Scan(&mode, &slot, &st.ChangedAt)
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
// then on wait for a relay. It first makes sure the connector has streamed
// every event written in CDC mode, or a relay could publish an aggregate's
// next event before them: it locks the events table against writes and
// asks the slot (through a temporary copy, which needs the REPLICATION
// attribute) whether an event inserted before that point lies past its
// confirmed position. If one does it returns a *SlotLagError and changes
// nothing, or, with cfg.Wait, waits for the connector until ctx ends (see
// [DispatchConfig.MaxWriterBlock]). Debezium confirms an event only after it
// sent a later record: configure heartbeats (docs/cdc.md). A slot that is
// gone is refused unless cfg.SkipSlotCheck. Keep the connector running
// until a relay runs (it also streams the new events; duplicates are
// absorbed), then delete it and drop its slot, which otherwise holds WAL
// back.
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
	if c.MaxWriterBlock <= 0 {
		c.MaxWriterBlock = 5 * time.Second
	}
	for {
		// The slot is asked first without the lock, so that a long
		// decode (a connector far behind) never holds writers off.
		if mode == DispatchRelay && !c.SkipSlotCheck {
			if err := waitSlot(ctx, db, &c); err != nil {
				return err
			}
		}
		current, err := setDispatch(ctx, db, mode, &c)
		var lag *SlotLagError
		if !errors.As(err, &lag) || !c.Wait {
			if err == nil {
				c.Logger.InfoContext(ctx, "producer: dispatch mode set", slog.String("schema", c.Schema),
					slog.String("from", current), slog.String("to", string(mode)), slog.String("slot", c.Slot))
			}
			return err
		}
	}
}

// setDispatch is one attempt of SetDispatch; it returns the mode it found.
//
// A switch back from CDC must not let the relay publish an event before
// the connector has streamed the older events of its aggregate. Writers
// and the switch are ordered by the events table's lock:
//
//  1. The switch takes EXCLUSIVE on the events table before anything
//     else. Every writer holds ROW EXCLUSIVE from its INSERT to its
//     commit, so the lock waits for the CDC-mode writes in flight and
//     keeps new ones out.
//  2. pg_current_wal_lsn() now lies past the commit of every event written
//     in CDC mode: that is the switch point.
//  3. The slot is asked (slotPending) whether an insert before the switch
//     point lies past its confirmed position. If one does, the attempt
//     rolls back and nothing changed; writers go on in CDC mode.
//  4. Otherwise the default of published_at is dropped and the mode set,
//     under the same lock. Writers blocked in 1 resume after the commit
//     with the new default (PostgreSQL rereads the table's definition
//     after it takes the lock), so their events wait for the relay,
//     which sees them only after every CDC-mode event was streamed.
func setDispatch(ctx context.Context, db outbox.DB, mode Dispatch, c *DispatchConfig) (string, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("producer: SetDispatch: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	sql := tables.ProducerFor(c.Schema).Dispatch
	// A plain read first: a row lock assigns a transaction id, after which
	// slotPending could not create its temporary slot.
	var current, slotName *string
	if err := tx.QueryRow(ctx, sql.Mode).Scan(&current, &slotName); err != nil {
		return "", fmt.Errorf("producer: SetDispatch: read the mode of schema %q (run Migrate first: the mode came with migration 0008): %w", c.Schema, err)
	}
	if mode == DispatchRelay && *current == string(DispatchCDC) && !c.SkipSlotCheck {
		if err := checkSwitchBack(ctx, tx, c, *slotName); err != nil {
			return "", err
		}
	}
	var locked string
	if err := tx.QueryRow(ctx, sql.LockMode).Scan(&locked); err != nil {
		return "", fmt.Errorf("producer: SetDispatch: lock the mode of schema %q: %w", c.Schema, err)
	}
	if locked != *current {
		return "", fmt.Errorf("producer: SetDispatch: the mode of schema %q changed from %s to %s during the switch; call again", c.Schema, *current, locked)
	}
	if mode == DispatchCDC {
		if err := checkCDCReady(ctx, tx, c.Schema, c.Slot); err != nil {
			return "", err
		}
	}
	stmt := sql.RelayDefault
	slot := any(nil)
	if mode == DispatchCDC {
		stmt = sql.CDCDefault
		slot = c.Slot
	}
	if _, err := tx.Exec(ctx, stmt); err != nil {
		return "", fmt.Errorf("producer: SetDispatch: set the default of published_at (needs the events table's owner): %w", err)
	}
	if _, err := tx.Exec(ctx, sql.SetMode, string(mode), slot); err != nil {
		return "", fmt.Errorf("producer: SetDispatch: record the mode: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("producer: SetDispatch: commit: %w", err)
	}
	return *current, nil
}

// checkSwitchBack runs steps 1 to 3 of setDispatch's switch back in tx.
// With [DispatchConfig.Wait] it holds the lock while the slot catches up,
// for at most MaxWriterBlock: under steady writes the connector's
// confirmed position trails by an offset flush, and without the lock new
// CDC-mode writes would keep it trailing for ever.
func checkSwitchBack(ctx context.Context, tx pgx.Tx, c *DispatchConfig, slot string) error {
	sql := tables.ProducerFor(c.Schema).Dispatch
	if _, err := tx.Exec(ctx, sql.LockEvents); err != nil {
		return fmt.Errorf("producer: SetDispatch: lock the events table: %w", err)
	}
	var target string
	if err := tx.QueryRow(ctx, sql.WALPosition).Scan(&target); err != nil {
		return fmt.Errorf("producer: SetDispatch: read the switch point: %w", err)
	}
	lag, err := slotPending(ctx, tx, c.Schema, slot, target)
	switch {
	case err != nil:
		return err
	case lag == nil:
		return nil
	case !c.Wait:
		return lag
	}
	blockCtx, cancel := context.WithTimeout(ctx, c.MaxWriterBlock)
	defer cancel()
	tick := time.NewTicker(slotPoll)
	defer tick.Stop()
	for {
		select {
		case <-blockCtx.Done():
			return lag
		case <-tick.C:
		}
		if lag, err = slotPending(ctx, tx, c.Schema, slot, target); err != nil || lag == nil {
			return err
		}
	}
}

// slotPoll is how often a waiting switch back asks the slot.
const slotPoll = 100 * time.Millisecond

// waitSlot asks the slot, without blocking writers, whether it has
// confirmed every event inserted before the current WAL position, when the
// schema is in CDC mode. If it has not, it returns the *SlotLagError, or
// with [DispatchConfig.Wait] asks again until it has or ctx ends.
func waitSlot(ctx context.Context, db outbox.DB, c *DispatchConfig) error {
	tick := time.NewTicker(slotPoll)
	defer tick.Stop()
	var last *SlotLagError
	for {
		lag, err := func() (*SlotLagError, error) {
			tx, err := db.Begin(ctx)
			if err != nil {
				return nil, fmt.Errorf("producer: SetDispatch: begin: %w", err)
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			var mode, slot *string
			if err := tx.QueryRow(ctx, tables.ProducerFor(c.Schema).Dispatch.Mode).Scan(&mode, &slot); err != nil {
				return nil, fmt.Errorf("producer: SetDispatch: read the mode of schema %q (run Migrate first: the mode came with migration 0008): %w", c.Schema, err)
			}
			if *mode != string(DispatchCDC) {
				return nil, nil
			}
			return slotPending(ctx, tx, c.Schema, *slot, "")
		}()
		switch {
		case err != nil && last != nil && ctx.Err() != nil:
			return fmt.Errorf("%w (waiting: %w)", last, ctx.Err())
		case err != nil:
			return err
		case lag == nil:
			return nil
		case !c.Wait:
			return lag
		}
		if last == nil {
			c.Logger.InfoContext(ctx, "producer: waiting for the CDC connector before switching back to the relay",
				slog.String("schema", c.Schema), slog.String("slot", lag.Slot), slog.Int64("pending", lag.Pending), slog.Int64("lag_bytes", lag.LagBytes))
		}
		last = lag
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (waiting: %w)", lag, ctx.Err())
		case <-tick.C:
		}
	}
}

// slotPending returns a *SlotLagError when the slot has not confirmed an
// insert into the events table that committed before target (a WAL
// position; "" is the current one), and nil when it has.
//
// The slot's confirmed_flush_lsn alone does not say: Debezium confirms
// the position stored with the last record Connect committed, which lies
// before the end of that record's transaction, and nothing past it while
// the published tables are idle, so comparing it with target would wait
// for ever. Instead a temporary copy
// of the slot decodes what lies between its confirmed position and
// target through the same publications (pgoutput, as the connector), and
// the inserts after the confirmed position are what the connector has not
// streamed. A copy is read, not the slot, which the connector holds; it
// needs the REPLICATION attribute, and tx must not have written.
func slotPending(ctx context.Context, tx pgx.Tx, schema, slot, target string) (*SlotLagError, error) {
	sql := tables.ProducerFor(schema).Dispatch
	var pubs *string
	if err := tx.QueryRow(ctx, sql.Publications, schema).Scan(&pubs); err != nil {
		return nil, fmt.Errorf("producer: SetDispatch: look up the publication of the events table: %w", err)
	}
	if pubs == nil {
		return nil, fmt.Errorf("producer: SetDispatch: the events table is in no publication, so whether the connector streamed the events written in CDC mode cannot be checked; restore the publication, or set DispatchConfig.SkipSlotCheck to switch back unchecked")
	}
	var copyName, confirmed string
	err := tx.QueryRow(ctx, sql.SlotCopy, slot).Scan(&copyName, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("producer: SetDispatch: replication slot %q is gone, so whether the connector streamed every event written in CDC mode cannot be checked; set DispatchConfig.SkipSlotCheck to switch back unchecked (events it had not streamed are never published)", slot)
	}
	if err != nil {
		return nil, fmt.Errorf("producer: SetDispatch: copy replication slot %q to read what it has not confirmed (needs the REPLICATION attribute): %w", slot, err)
	}
	defer func() { _, _ = tx.Exec(context.WithoutCancel(ctx), sql.DropSlot, copyName) }()
	lag := &SlotLagError{Slot: slot}
	err = tx.QueryRow(ctx, sql.SlotPending, copyName, target, *pubs, confirmed).Scan(&lag.Pending, &lag.LagBytes)
	if err != nil {
		return nil, fmt.Errorf("producer: SetDispatch: decode what replication slot %q has not confirmed: %w", slot, err)
	}
	if lag.Pending == 0 {
		return nil, nil
	}
	return lag, nil
}

// checkCDCReady checks, inside SetDispatch's transaction, what the switch
// to CDC needs, and takes the lock that keeps new undelivered events out
// until the switch commits. EXCLUSIVE mode lets readers on and blocks
// every write, the relay's marks included; the count uses the partial
// index of undelivered events.
func checkCDCReady(ctx context.Context, tx pgx.Tx, schema, slot string) error {
	sql := tables.ProducerFor(schema).Dispatch
	var plugin *string
	var found bool
	err := tx.QueryRow(ctx, sql.Slot, slot).Scan(&found, &plugin)
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
	err = tx.QueryRow(ctx, sql.Published, schema).Scan(&published, &viaRoot, &partitioned)
	if err != nil {
		return fmt.Errorf("producer: SetDispatch: look up the publication of the events table: %w", err)
	}
	events := pgx.Identifier{schema, "events"}.Sanitize()
	switch {
	case !published && partitioned:
		return fmt.Errorf("producer: SetDispatch: the events table is in no publication as itself; a day-partitioned table needs publish_via_partition_root, or pgoutput reports its partitions and the connector captures nothing: CREATE PUBLICATION outbox_cdc FOR TABLE %s WITH (publish_via_partition_root = true)", events)
	case !published:
		return fmt.Errorf("producer: SetDispatch: the events table is in no publication, so the connector would capture nothing: CREATE PUBLICATION outbox_cdc FOR TABLE %s (and name it in Debezium's publication.name)", events)
	case partitioned && !viaRoot:
		return fmt.Errorf("producer: SetDispatch: the publication of the day-partitioned events table lacks publish_via_partition_root, so pgoutput reports the partitions and the connector captures nothing: ALTER PUBLICATION ... SET (publish_via_partition_root = true)")
	}
	if _, err := tx.Exec(ctx, sql.LockEvents); err != nil {
		return fmt.Errorf("producer: SetDispatch: lock the events table: %w", err)
	}
	var undelivered int64
	if err := tx.QueryRow(ctx, sql.CountUndelivered).Scan(&undelivered); err != nil {
		return fmt.Errorf("producer: SetDispatch: count undelivered events: %w", err)
	}
	if undelivered > 0 {
		return fmt.Errorf("producer: SetDispatch: %d events are undelivered and would never be published after the switch; with the connector streaming, let the relay deliver them (Inspector.Health says when Undelivered is 0) and call again", undelivered)
	}
	return nil
}
