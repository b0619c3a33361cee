-- 0004: two fewer indexes for every write to pay for. Each index on events
-- costs every Write, even a partial one whose predicate never holds for a
-- new row: the executor opens it and prepares its predicate for every
-- statement. Measured with a business transaction and one Write at 16
-- connections, dropping the two below gave about 6% more commits/s.
--
-- - events_blocking found the undelivered events that failed at least once,
--   which hold back the later events of their aggregate. retrying_events now
--   lists them, kept by triggers that fire on the relay's updates and
--   deletes and never on an insert (a new event has not failed yet). Triggers
--   rather than the relay's own statements keep the list, so that it stays
--   complete whichever relay version (or operator) records a failure. The
--   claim looks each listed id up in events and checks it again, so an entry
--   that outlived its event's failure holds nothing back.
-- - events_published found delivered events by age for retention. Retention
--   now walks the primary key from the lowest id and stops at rows created
--   inside the window.
--
-- Upgrading: relays built after this migration need it (until it runs their
-- claims fail and they retry, logging the error, publishing nothing); relays
-- built before it keep publishing correctly after it, but each of their
-- claims reads the whole backlog to find failed events, and their retention
-- scans the whole table. Migrate, then replace the relays. Writers of any
-- version work with or without it.
--
-- DROP INDEX and CREATE TRIGGER lock events; lock_timeout keeps this
-- migration from waiting behind a long transaction while every writer waits
-- behind it. If it times out, Migrate fails with SQLSTATE 55P03 and changes
-- nothing, and the next run tries again.

SET LOCAL lock_timeout = '5s';

CREATE TABLE retrying_events (
    id bigint PRIMARY KEY
);

INSERT INTO retrying_events (id)
SELECT id FROM events WHERE published_at IS NULL AND attempts > 0;

-- The function bodies name the table with this schema written in, like
-- 0001's did, rather than through SET search_path on the function.
DO $migrate$
BEGIN
    EXECUTE format($body$
CREATE FUNCTION note_retrying_event() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO %I.retrying_events (id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$fn$$body$, current_schema());
    EXECUTE format($body$
CREATE FUNCTION forget_retrying_event() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM %I.retrying_events WHERE id = OLD.id;
    RETURN NULL;
END
$fn$$body$, current_schema());
END
$migrate$;

-- A failure is recorded by raising attempts; the event leaves the list when
-- it is delivered or deleted (moved to dead_events). The events row stays
-- locked by the statement until its transaction ends, so the list's changes
-- for one event never race.
CREATE TRIGGER events_note_retrying AFTER UPDATE OF attempts ON events
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

RESET lock_timeout;
