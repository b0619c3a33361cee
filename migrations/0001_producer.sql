-- 0001: the producer's tables. The writer inserts into events and bumps
-- sequences in the caller's transaction; the relay claims undelivered events,
-- publishes them and marks them; events that exhaust their attempts move to
-- dead_events so that nothing is ever dropped silently.
--
-- Names are unqualified: Migrate runs this file with search_path set to the
-- configured schema, and users of other migration tools do the same.

-- events may already exist, created partitioned by day from
-- partitioned_events.sql; every statement below works on either layout.
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
    -- bucket_hash spreads aggregates over the relay's buckets; generated so
    -- that rows inserted by other writers (plain SQL, other languages) get it.
    bucket_hash        integer     GENERATED ALWAYS AS (hashtext(aggregate_type || ':' || aggregate_id)) STORED,
    created_at         timestamptz NOT NULL DEFAULT now(),
    published_at       timestamptz,
    attempts           integer     NOT NULL DEFAULT 0,
    permanent_failures integer     NOT NULL DEFAULT 0,
    next_attempt_at    timestamptz NOT NULL DEFAULT now(),
    leased_until       timestamptz,
    last_error         text
);

-- The claim query walks this index in id order; it holds only undelivered
-- rows, so its size tracks the backlog, not the history.
CREATE INDEX IF NOT EXISTS events_undelivered ON events (id) WHERE published_at IS NULL;

-- Rows that failed at least once hold back the later events of their
-- aggregate until they are delivered. The index holds only those rows, so
-- the claim's probe into it costs next to nothing. (It leaves leased_until
-- out on purpose: a claim then changes no indexed column and its UPDATE
-- can stay a heap-only tuple update.)
CREATE INDEX IF NOT EXISTS events_blocking ON events (aggregate_type, aggregate_id, id)
    WHERE published_at IS NULL AND attempts > 0;

-- Retention deletes delivered rows by age.
CREATE INDEX IF NOT EXISTS events_published ON events (published_at) WHERE published_at IS NOT NULL;

-- The row lock taken by the writer's upsert orders concurrent writers of one
-- aggregate, so sequence order is commit order.
CREATE TABLE sequences (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_seq       bigint NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

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
-- worth a NOTIFY.
CREATE TABLE relays (
    relay_id     text        PRIMARY KEY,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    idle_until   timestamptz
);

-- NOTIFY takes a database-wide lock at commit that serialises every
-- notifying transaction. This trigger runs at commit (deferred) and notifies
-- only while some relay says it is idle; a busy relay finds new rows on its
-- next claim anyway. The channel name carries a hash of the schema, so that
-- several outbox schemas in one database wake only their own relays and a
-- long schema name cannot overflow the 63-byte channel limit.
-- The body names the relays table and the channel with this schema's
-- values written in, rather than through SET search_path on the function:
-- it runs for every written event, and a function-level setting costs a
-- configuration save and restore on every call.
DO $migrate$
BEGIN
    EXECUTE format($body$
CREATE FUNCTION wake_relay() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM %I.relays WHERE idle_until > now()) THEN
        PERFORM pg_notify(%L, '');
    END IF;
    RETURN NULL;
END
$fn$$body$, current_schema(), 'outbox_' || left(md5(current_schema()), 16));
END
$migrate$;

CREATE CONSTRAINT TRIGGER events_wake_relay AFTER INSERT ON events
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION wake_relay();

-- What to alert on: the age of the oldest undelivered event and any dead one.
CREATE VIEW health AS
SELECT (SELECT count(*) FROM events WHERE published_at IS NULL) AS undelivered,
       -- The lowest undelivered id is the oldest row give or take commit
       -- order, and costs one index probe instead of a scan of the backlog.
       coalesce(extract(epoch FROM now() - (SELECT created_at FROM events WHERE published_at IS NULL ORDER BY id LIMIT 1)), 0)::float8 AS oldest_undelivered_seconds,
       (SELECT count(*) FROM dead_events WHERE status = 'dead') AS dead;
