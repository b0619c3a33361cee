-- Optional layout, run before 0001_baseline.sql: the events table
-- partitioned by day on created_at, so retention drops whole partitions
-- instead of deleting rows (no bloat, no vacuum debt). 0001 then adds the
-- index, triggers and view to this table as it would to a plain one.
--
-- Partitions are named events_pYYYYMMDD (UTC days). create_event_partitions
-- makes them ahead of time; the default partition only catches rows when that
-- has not run, so that a write never fails for want of a partition.

CREATE TABLE events (
    id                 bigint GENERATED ALWAYS AS IDENTITY,
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
    last_error         text,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

CREATE TABLE events_default PARTITION OF events DEFAULT;

-- create_event_partitions makes the partitions for today and the next
-- days_ahead days (UTC) and returns how many it created. A day whose rows
-- already sit in the default partition (written while nobody created
-- partitions) is skipped with a notice: creating it would fail, and its
-- rows stay where they are until retention deletes them.
CREATE FUNCTION create_event_partitions(days_ahead integer) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    day     date := (now() AT TIME ZONE 'UTC')::date;
    created integer := 0;
    name    text;
BEGIN
    FOR i IN 0..days_ahead LOOP
        name := 'events_p' || to_char(day + i, 'YYYYMMDD');
        IF to_regclass(quote_ident(current_schema()) || '.' || quote_ident(name)) IS NULL THEN
            IF EXISTS (SELECT 1 FROM events_default
                       WHERE created_at >= ((day + i)::timestamp AT TIME ZONE 'UTC')
                         AND created_at < ((day + i + 1)::timestamp AT TIME ZONE 'UTC')) THEN
                RAISE NOTICE 'outbox: day % has rows in events_default; not partitioned', day + i;
                CONTINUE;
            END IF;
            EXECUTE format('CREATE TABLE %I PARTITION OF events FOR VALUES FROM (%L) TO (%L)',
                           name,
                           ((day + i)::timestamp AT TIME ZONE 'UTC'),
                           ((day + i + 1)::timestamp AT TIME ZONE 'UTC'));
            created := created + 1;
        END IF;
    END LOOP;
    RETURN created;
END
$$;

-- drop_event_partitions drops the day partitions that end before cutoff and
-- hold no undelivered event, and returns how many it dropped. A partition
-- with an undelivered row is kept whatever its age: retention never loses an
-- event that is still owed to the broker. Each partition is locked before
-- it is checked, so a row replayed into it meanwhile cannot be dropped
-- with it; lock_timeout keeps a long transaction from queueing writers
-- behind the DROP (the next run tries again).
CREATE FUNCTION drop_event_partitions(cutoff timestamptz) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    part    record;
    pending boolean;
    dropped integer := 0;
BEGIN
    PERFORM set_config('lock_timeout', '2s', true);
    FOR part IN
        SELECT c.relname
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'events'::regclass
          AND c.relname ~ '^events_p[0-9]{8}$'
          AND (to_date(substr(c.relname, 9), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' <= cutoff
        ORDER BY c.relname
    LOOP
        EXECUTE format('LOCK TABLE events, %I IN ACCESS EXCLUSIVE MODE', part.relname);
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE published_at IS NULL)', part.relname) INTO pending;
        IF NOT pending THEN
            EXECUTE format('DROP TABLE %I', part.relname);
            dropped := dropped + 1;
        END IF;
    END LOOP;
    RETURN dropped;
END
$$;

-- The first week of partitions, so that rows written before the first
-- retention run do not land in the default partition.
SELECT create_event_partitions(7);
