-- 0002: the consumer's tables. A consumer applies each record's effect in
-- its own database transaction together with a row in processed_keys (so a
-- redelivered record is recognised by the primary key, never by a
-- read-then-write race), a bump of its aggregate's row in positions (so
-- effects apply in sequence order), and, when a record cannot be applied
-- yet or at all, a row in parked or dead_letters holding the whole record so
-- that nothing is ever dropped. These tables live in the consuming
-- service's database and are read and written on the primary only.
--
-- Names are unqualified: Migrate runs this file with search_path set to the
-- configured schema, and users of other migration tools do the same. The
-- names do not clash with the producer's tables of 0001, so one schema can
-- hold both halves.

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
-- it. One row per consumer and record, so a redelivered failure updates the
-- row instead of adding one.
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
