-- 0001: the baseline, both halves of the SDK. The producer's tables: the
-- writer inserts into events and bumps sequences in the caller's
-- transaction; the relay claims undelivered events, publishes them and marks
-- them; events that exhaust their attempts move to dead_events, so nothing
-- is dropped silently. The consumer's tables: a consumer applies each
-- record's effect in its own transaction together with a row in
-- processed_keys (a redelivery is recognised by the primary key, never by a
-- read-then-write race) and a move of its aggregate's row in positions
-- (effects apply in sequence order); a record that cannot be applied yet or
-- at all waits, whole, in parked or dead_letters. The consumer's tables live
-- in the consuming service's database and are read and written on the
-- primary only; the names of the two halves do not clash, so one schema can
-- hold both.
--
-- This file is the schema that migrations 0001 to 0004 of earlier builds
-- left behind; a schema they migrated is already at this version.
--
-- Names are unqualified: Migrate runs this file with search_path set to the
-- configured schema, and users of other migration tools do the same.

-- events may already exist, created partitioned by day from
-- partitioned_events.sql; every statement below works on either layout.
-- Only the primary key and events_undelivered index it: every index costs
-- every write, partial or not.
CREATE TABLE IF NOT EXISTS events (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id           uuid        NOT NULL,
    idempotency_key    text        NOT NULL,
    aggregate_type     text        NOT NULL,
    aggregate_id       text        NOT NULL,
    aggregate_seq      bigint      NOT NULL,
    event_type         text        NOT NULL,
    topic              text,
    content_type       text,
    payload            bytea       NOT NULL,
    headers            jsonb       NOT NULL DEFAULT '{}',
    created_at         timestamptz NOT NULL DEFAULT now(),
    published_at       timestamptz,
    attempts           integer     NOT NULL DEFAULT 0,
    permanent_failures integer     NOT NULL DEFAULT 0,
    next_attempt_at    timestamptz NOT NULL DEFAULT now(),
    leased_until       timestamptz,
    last_error         text
);

-- The claim walks this index in id order; it holds only undelivered rows,
-- so its size follows the backlog, not the history. Retention walks the
-- primary key from the lowest id instead of an index on published_at.
CREATE INDEX IF NOT EXISTS events_undelivered ON events (id) WHERE published_at IS NULL;

-- The row lock taken by the writer's upsert orders concurrent writers of one
-- aggregate, so sequence order is commit order.
CREATE TABLE sequences (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_seq       bigint NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- The undelivered events that failed at least once: each holds back the
-- later events of its aggregate until it is delivered. Triggers keep the
-- list (below), so that relays of any version keep it complete; the claim
-- checks each entry against events again, so an entry that outlived its
-- failure holds nothing back, and Prune removes it. created_at is the
-- partitioned layout's partition key: with it, a lookup touches one
-- partition. Rows inserted or copied with attempts already above 0, or
-- moved to another partition by an update of created_at, are not seen by
-- the triggers: list them with
--   INSERT INTO retrying_events (id, created_at)
--   SELECT id, created_at FROM events WHERE published_at IS NULL AND attempts > 0
--   ON CONFLICT (id) DO NOTHING;
CREATE TABLE retrying_events (
    id         bigint      PRIMARY KEY,
    created_at timestamptz NOT NULL
);

-- The trigger functions run as their owner (SECURITY DEFINER, with a fixed
-- search_path), so that a relay role granted rights table by table can
-- record failures without rights on retrying_events. The body names the
-- table with this schema written in.
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
-- to dead_events). No trigger fires on insert: a new event has not failed.
-- The events row stays locked by the statement until its transaction ends,
-- so the list's changes for one event never race.
CREATE TRIGGER events_note_retrying AFTER UPDATE OF attempts, published_at ON events
    FOR EACH ROW WHEN (NEW.attempts > 0 AND NEW.published_at IS NULL)
    EXECUTE FUNCTION note_retrying_event();
CREATE TRIGGER events_forget_delivered AFTER UPDATE OF published_at ON events
    FOR EACH ROW WHEN (OLD.attempts > 0 AND NEW.published_at IS NOT NULL)
    EXECUTE FUNCTION forget_retrying_event();
CREATE TRIGGER events_forget_deleted AFTER DELETE ON events
    FOR EACH ROW WHEN (OLD.attempts > 0 AND OLD.published_at IS NULL)
    EXECUTE FUNCTION forget_retrying_event();

-- Events that exhausted their attempts. status: dead (held, blocking its
-- aggregate when hold is true), replayed (moved back to events), discarded.
CREATE TABLE dead_events (
    id               bigint      PRIMARY KEY,
    event_id         uuid        NOT NULL,
    idempotency_key  text        NOT NULL,
    aggregate_type   text        NOT NULL,
    aggregate_id     text        NOT NULL,
    aggregate_seq    bigint      NOT NULL,
    event_type       text        NOT NULL,
    topic            text,
    content_type     text,
    payload          bytea       NOT NULL,
    headers          jsonb       NOT NULL,
    created_at       timestamptz NOT NULL,
    attempts         integer     NOT NULL,
    last_error       text        NOT NULL,
    hold             boolean     NOT NULL,
    status           text        NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'replayed', 'discarded')),
    died_at          timestamptz NOT NULL DEFAULT now(),
    resolved_at      timestamptz
);

CREATE INDEX dead_events_held ON dead_events (aggregate_type, aggregate_id)
    WHERE status = 'dead' AND hold;

-- One row per running relay instance: its heartbeat tells the others how
-- many share the buckets, and idle_until tells writers whether a wake-up is
-- worth a NOTIFY (the writer asks inside its own statement; rows written by
-- other means wake no relay, and the relay's poll finds them).
CREATE TABLE relays (
    relay_id     text        PRIMARY KEY,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    idle_until   timestamptz
);

-- What to alert on: the age of the oldest undelivered event and any dead one.
CREATE VIEW health AS
SELECT (SELECT count(*) FROM events WHERE published_at IS NULL) AS undelivered,
       -- The lowest undelivered id is the oldest row give or take commit
       -- order, and costs one index probe instead of a scan of the backlog.
       coalesce(extract(epoch FROM now() - (SELECT created_at FROM events WHERE published_at IS NULL ORDER BY id LIMIT 1)), 0)::float8 AS oldest_undelivered_seconds,
       (SELECT count(*) FROM dead_events WHERE status = 'dead') AS dead;

-- One row per key a consumer has taken custody of (applied or parked).
-- Retention deletes by age; rows are inserted in roughly processed_at order,
-- so a BRIN index finds the old ones for a fraction of a btree's size and
-- write cost.
CREATE TABLE processed_keys (
    consumer     text        NOT NULL,
    key          text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key)
);

CREATE INDEX processed_keys_age ON processed_keys USING brin (processed_at);

-- The last sequence number applied per consumer and aggregate. parked counts
-- the aggregate's rows in parked, so the hot path learns from the row it
-- already updates whether there is anything to drain.
CREATE TABLE positions (
    consumer       text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    last_seq       bigint      NOT NULL CHECK (last_seq >= 0),
    parked         integer     NOT NULL DEFAULT 0 CHECK (parked >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
);

-- Records that arrived ahead of a gap (or behind a dead-lettered record of
-- their aggregate), waiting to be applied in order. The whole record is kept:
-- header values are bytea so that binary headers survive.
CREATE TABLE parked (
    consumer        text        NOT NULL,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    seq             bigint      NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    record_key      bytea,
    value           bytea,
    header_keys     text[]      NOT NULL,
    header_values   bytea[]     NOT NULL,
    record_time     timestamptz,
    idempotency_key text,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id, seq)
);

-- Records a consumer gave up on: the whole record, why, and what became of
-- it. A redelivered failure updates its row instead of adding one (0005
-- makes that one row per record rather than per offset).
CREATE TABLE dead_letters (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    record_key      bytea,
    value           bytea,
    header_keys     text[]      NOT NULL,
    header_values   bytea[]     NOT NULL,
    record_time     timestamptz,
    idempotency_key text,
    aggregate_type  text,
    aggregate_id    text,
    aggregate_seq   bigint,
    error           text        NOT NULL,
    stack           text,
    attempts        integer     NOT NULL,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    status          text        NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'replayed', 'discarded')),
    resolved_at     timestamptz,
    UNIQUE (consumer, topic, kafka_partition, kafka_offset)
);

-- Ordering asks whether an aggregate is held by a dead letter; operators list
-- the open ones.
CREATE INDEX dead_letters_open ON dead_letters (consumer, aggregate_type, aggregate_id, aggregate_seq)
    WHERE status = 'dead';
