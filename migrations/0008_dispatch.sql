-- 0008: who publishes a schema's events. Until now only the relay did: it
-- claims the rows whose published_at is NULL, publishes them and sets it.
-- A schema can now be dispatched by change data capture instead: a
-- Debezium connector reads the inserts from the WAL through a logical
-- replication slot and publishes them with its outbox event router
-- (docs/cdc.md). The two must never both publish, and CDC never sets
-- published_at, which the health view, Prune and the relay's claim all
-- read.
--
-- dispatch holds the schema's one mode row. producer.SetDispatch changes
-- it, and with it the events table's default for published_at: in CDC
-- mode a row is written as published (the log is the authority on what
-- was committed, and the connector reads it from there), so that
--   - the relay finds nothing to claim, even one started by mistake (it
--     also refuses to run, and stops, in CDC mode);
--   - Prune deletes by age and drops day partitions as it does for
--     delivered events, and the events_undelivered index stays empty;
--   - the health view's undelivered count and age stay 0 instead of
--     calling every event undelivered. What can lag in CDC mode is the
--     slot: the view reports its state and the WAL it holds back.
CREATE TABLE dispatch (
    only_row   boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    mode       text        NOT NULL DEFAULT 'relay' CHECK (mode IN ('relay', 'cdc')),
    -- The logical replication slot the connector reads, in CDC mode.
    slot_name  text,
    changed_at timestamptz NOT NULL DEFAULT now(),
    CHECK (mode = 'relay' OR slot_name IS NOT NULL)
);
INSERT INTO dispatch DEFAULT VALUES;

-- The health view gains the dispatch mode and, in CDC mode, the slot's
-- state: whether a connector is attached (active), how much WAL the slot
-- keeps from being removed (retained: it grows without bound while the
-- connector is down, until the disk is full or max_slot_wal_keep_size
-- invalidates the slot), and how far the connector's confirmed position
-- is behind the server's (lag). pg_replication_slots and
-- pg_current_wal_lsn() are open to every role. On a standby the WAL
-- position is not there to read, and the two byte counts are NULL.
CREATE OR REPLACE VIEW health AS
SELECT (SELECT count(*) FROM events WHERE published_at IS NULL) AS undelivered,
       coalesce(extract(epoch FROM now() - (SELECT created_at FROM events WHERE published_at IS NULL ORDER BY id LIMIT 1)), 0)::float8 AS oldest_undelivered_seconds,
       (SELECT count(*) FROM dead_events WHERE status = 'dead') AS dead,
       d.mode AS dispatch,
       d.slot_name AS cdc_slot,
       coalesce(s.active, false) AS cdc_slot_active,
       CASE WHEN s.slot_name IS NOT NULL AND NOT pg_is_in_recovery()
            THEN pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint END AS cdc_retained_wal_bytes,
       CASE WHEN s.slot_name IS NOT NULL AND NOT pg_is_in_recovery()
            THEN pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint END AS cdc_lag_bytes
FROM dispatch d
LEFT JOIN pg_replication_slots s ON s.slot_name = d.slot_name AND s.database = current_database();
