-- 0007: operating a consumer from outside its process.
--
-- Dead letters get the class of their failure (reason) and a fingerprint
-- (failure) that groups letters failing the same way: the reason, the
-- error's type and the handler's first stack frame for a panic, or the
-- error's wording with its numbers masked. Letters written before this
-- migration are classified here by how the SDK words its errors, as
-- consumer.ReadHealth did.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS reason text;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS failure text;
UPDATE dead_letters SET reason = CASE
        WHEN error LIKE 'consumer: handler panicked%' THEN 'panic'
        WHEN error LIKE 'consumer: handler did not finish within%' THEN 'timeout'
        WHEN error LIKE 'consumer: not done on the share group''s last delivery%' THEN 'delivery_limit'
        WHEN error LIKE 'consumer: sequence %' THEN 'sequence'
        WHEN error LIKE 'consumer: %' THEN 'input'
        ELSE 'handler' END
    WHERE reason IS NULL;
UPDATE dead_letters SET failure = reason || ': ' || left(regexp_replace(error, '[0-9]+', 'N', 'g'), 160)
    WHERE failure IS NULL;
-- A consumer built before this migration writes neither column; its
-- letters are classed as the handler's.
ALTER TABLE dead_letters ALTER COLUMN reason SET DEFAULT 'handler', ALTER COLUMN reason SET NOT NULL;
ALTER TABLE dead_letters ALTER COLUMN failure SET DEFAULT 'handler', ALTER COLUMN failure SET NOT NULL;

-- The dashboard and `outbox letters` group a consumer's open letters by
-- fingerprint and filter them by reason.
CREATE INDEX IF NOT EXISTS dead_letters_failure ON dead_letters (consumer, failure) WHERE status = 'dead';

-- A request is an operator's replay, discard or resolve-gap for a consumer,
-- carried out by that consumer's running process, which has the handler.
-- It names one letter, or a filter over the open letters (a bulk request),
-- or one aggregate (resolve_gap). The process claims it (status running,
-- with a lease it renews as it goes, so a request whose process died is
-- taken up again), then writes the outcome back.
CREATE TABLE IF NOT EXISTS operator_requests (
    id             bigserial   PRIMARY KEY,
    consumer       text        NOT NULL,
    action         text        NOT NULL CHECK (action IN ('replay', 'discard', 'resolve_gap')),
    letter_id      bigint,
    topic          text,
    aggregate_type text,
    aggregate_id   text,
    reason         text,
    failure        text,
    failed_after   timestamptz,
    failed_before  timestamptz,
    rate           double precision,
    requested_by   text        NOT NULL,
    requested_at   timestamptz NOT NULL DEFAULT now(),
    status         text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'done', 'failed')),
    lease_until    timestamptz,
    started_at     timestamptz,
    finished_at    timestamptz,
    matched        bigint      NOT NULL DEFAULT 0,
    applied        bigint      NOT NULL DEFAULT 0,
    duplicates     bigint      NOT NULL DEFAULT 0,
    discarded      bigint      NOT NULL DEFAULT 0,
    failed         bigint      NOT NULL DEFAULT 0,
    skipped        bigint      NOT NULL DEFAULT 0,
    drained        bigint      NOT NULL DEFAULT 0,
    error          text
);
CREATE INDEX IF NOT EXISTS operator_requests_open ON operator_requests (consumer, id) WHERE status IN ('pending', 'running');

-- Every operator action, carried out or refused, whoever asked for it.
CREATE TABLE IF NOT EXISTS operator_audit (
    id             bigserial   PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT now(),
    actor          text        NOT NULL,
    consumer       text        NOT NULL,
    action         text        NOT NULL,
    request_id     bigint,
    letter_id      bigint,
    aggregate_type text,
    aggregate_id   text,
    outcome        text        NOT NULL,
    detail         text
);
CREATE INDEX IF NOT EXISTS operator_audit_consumer ON operator_audit (consumer, id);
