-- 0011: who is running, and how much got done lately.
--
-- An operator at 3 a.m. could not tell whether any process of a consumer
-- was alive: a request to a consumer with no live member waited for ever,
-- and nothing said so. consumer_members holds one row per running
-- Consumer (a process's consumer.Consumer.Run), beaten every few seconds;
-- a member whose beat is old is gone. The rows of members gone for a day
-- are deleted by the live ones.
--
-- activity counts, per minute, the records each consumer applied and the
-- events each schema's relays delivered, for the dashboard's charts and
-- rates. It keeps two days; the writers delete older minutes.
CREATE TABLE IF NOT EXISTS consumer_members (
    consumer     text        NOT NULL,
    member_id    text        NOT NULL,
    group_name   text        NOT NULL DEFAULT '',
    host         text        NOT NULL DEFAULT '',
    pid          integer     NOT NULL DEFAULT 0,
    partitions   integer     NOT NULL DEFAULT 0,
    applied      bigint      NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, member_id)
);

CREATE TABLE IF NOT EXISTS activity (
    kind   text        NOT NULL CHECK (kind IN ('applied', 'delivered')),
    name   text        NOT NULL,
    minute timestamptz NOT NULL,
    n      bigint      NOT NULL CHECK (n >= 0),
    PRIMARY KEY (kind, name, minute)
);
