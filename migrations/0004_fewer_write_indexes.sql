-- 0004: two fewer indexes for every write to pay for. Each index on events
-- costs every Write, even a partial one whose predicate never holds for a
-- new row: the executor opens it and prepares its predicate for every
-- statement. Measured with a business transaction and one Write at 16
-- connections, dropping the two below gave about 6% more commits/s.
--
-- - events_blocking found the undelivered events that failed at least once,
--   which hold back the later events of their aggregate. retrying_events now
--   lists them, kept by triggers that fire when a relay records a failure
--   (raises attempts), delivers or deletes such an event, and never on an
--   insert (a new event has not failed yet). Triggers rather than the
--   relay's own statements keep the list, so that relays of any version keep
--   it complete. The claim looks each listed event up in events and checks
--   it again, so an entry that outlived its event's failure holds nothing
--   back, and Prune removes such entries. What the triggers do not see: rows
--   inserted or copied with attempts already above 0, and rows moved to
--   another partition by an UPDATE of created_at. After such a change, list
--   them by running the INSERT INTO retrying_events below again.
-- - events_published found delivered events by age for retention. Retention
--   now walks the primary key from the lowest id and stops at rows created
--   inside the window.
--
-- The trigger functions run as their owner (SECURITY DEFINER, with a fixed
-- search_path), so that a relay role granted rights table by table, before
-- this table existed, can still record failures. A relay built after this
-- migration also reads retrying_events in its claim: grant it SELECT there.
--
-- Upgrading: relays built after this migration need it (until it runs their
-- claims fail and they retry, logging the error, publishing nothing); relays
-- built before it keep publishing correctly after it, but each of their
-- claims reads the whole backlog to find failed events, and each of their
-- retention runs scans the whole table. Set their Retention below zero, or
-- stop them, before migrating, and replace them soon after. Writers of any
-- version work with or without it.
--
-- The events table is locked first, for the whole migration: a failure
-- recorded between the backfill and the creation of the triggers would be
-- listed by neither. lock_timeout keeps this migration from waiting behind
-- a long transaction while every writer waits behind it; if it times out,
-- Migrate fails with SQLSTATE 55P03 and changes nothing, and the next run
-- tries again. The backfill must see every failure committed before the
-- lock, which only a statement snapshot does.

SET LOCAL lock_timeout = '5s';
LOCK TABLE events IN ACCESS EXCLUSIVE MODE;
RESET lock_timeout;

DO $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'outbox migration 0004 must run in a READ COMMITTED transaction, not %',
            current_setting('transaction_isolation');
    END IF;
END
$$;

-- created_at is the partitioned layout's partition key: with it, the
-- claim's lookup of a listed event touches one partition, not all of them.
CREATE TABLE retrying_events (
    id         bigint      PRIMARY KEY,
    created_at timestamptz NOT NULL
);

INSERT INTO retrying_events (id, created_at)
SELECT id, created_at FROM events WHERE published_at IS NULL AND attempts > 0
ON CONFLICT (id) DO NOTHING;

DO $migrate$
BEGIN
    EXECUTE format($body$
CREATE FUNCTION note_retrying_event() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    INSERT INTO %I.retrying_events (id, created_at) VALUES (NEW.id, NEW.created_at)
    ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END
$fn$$body$, current_schema());
    EXECUTE format($body$
CREATE FUNCTION forget_retrying_event() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    DELETE FROM %I.retrying_events WHERE id = OLD.id;
    RETURN NULL;
END
$fn$$body$, current_schema());
END
$migrate$;

-- A failure is recorded by raising attempts; an operator who sets
-- published_at back to NULL on an event that had failed makes it owed
-- again. The event leaves the list when it is delivered or deleted (moved
-- to dead_events). The events row stays locked by the statement until its
-- transaction ends, so the list's changes for one event never race.
CREATE TRIGGER events_note_retrying AFTER UPDATE OF attempts, published_at ON events
    FOR EACH ROW WHEN (NEW.attempts > 0 AND NEW.published_at IS NULL)
    EXECUTE FUNCTION note_retrying_event();
CREATE TRIGGER events_forget_delivered AFTER UPDATE OF published_at ON events
    FOR EACH ROW WHEN (OLD.attempts > 0 AND NEW.published_at IS NOT NULL)
    EXECUTE FUNCTION forget_retrying_event();
CREATE TRIGGER events_forget_deleted AFTER DELETE ON events
    FOR EACH ROW WHEN (OLD.attempts > 0 AND OLD.published_at IS NULL)
    EXECUTE FUNCTION forget_retrying_event();

DROP INDEX IF EXISTS events_blocking;
DROP INDEX IF EXISTS events_published;
