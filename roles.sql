-- Least-privilege roles for one outbox schema, printed by `outbox sql
-- -roles [-schema S]` and outbox.RolesSQL. Run it as the schema's owner
-- (the role that ran Migrate), after Migrate; it is idempotent, so run it
-- again after a later Migrate adds tables.
--
-- Each role is a NOLOGIN group named after the schema. Grant it to the
-- login role each component runs as:
--
--   CREATE ROLE orders_relay LOGIN PASSWORD '...';
--   GRANT {relay} TO orders_relay;
--
-- Migrate and SetDispatch stay with the owner: they create and alter the
-- tables. No role here can.
--
-- Partitioned layout (migrate -partition-by-day): writers, relays and
-- operators reach the day partitions through the events table, whose
-- privileges are what count there, so partitions created later need no
-- grants and no ALTER DEFAULT PRIVILEGES. Pruning is the exception: it
-- creates, empties and drops partitions, which needs the events table's
-- owner. Set RelayConfig.Retention negative in relays that run as {relay}
-- and run producer.Prune from a job that logs in as the owner.

DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY[{writer_lit}, {relay_lit}, {consumer_lit}, {operator_lit}, {dashboard_lit}] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
END
$roles$;

GRANT USAGE ON SCHEMA {schema} TO {writer}, {relay}, {consumer}, {operator}, {dashboard};
-- Every component but the writer checks at start that the schema is
-- migrated (outbox.CheckMigrated).
GRANT SELECT ON {schema}.schema_versions TO {relay}, {consumer}, {operator}, {dashboard};

-- writer: producer.Writer.Write. It numbers each aggregate's events in
-- sequences (an upsert that returns the number), inserts the events (and
-- reads back their ids), and wakes an idle relay: the NOTIFY needs no
-- grant, the look at relays does.
GRANT SELECT, INSERT, UPDATE ON {schema}.sequences TO {writer};
GRANT SELECT, INSERT ON {schema}.events TO {writer};
GRANT SELECT ON {schema}.relays TO {writer};

-- relay: producer.Relay. It registers itself in relays, claims, marks and
-- dead-letters events (dead_events, retrying_events), prunes what is
-- delivered, reads the dispatch mode and the health view. Its bucket locks
-- are advisory locks, which need no grant.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.relays TO {relay};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.events TO {relay};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.dead_events, {schema}.retrying_events TO {relay};
GRANT SELECT ON {schema}.dispatch, {schema}.health TO {relay};
-- It counts the events it delivered per minute (and prunes old minutes).
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.activity TO {relay};

-- consumer: consumer.Consumer. Its dedupe keys, positions, parked records
-- and dead letters are its own; it claims the operator requests addressed
-- to it, writes their progress and outcome, and audits each action.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.processed_keys, {schema}.positions, {schema}.parked, {schema}.dead_letters TO {consumer};
GRANT SELECT, UPDATE ON {schema}.operator_requests TO {consumer};
GRANT SELECT, INSERT ON {schema}.operator_audit TO {consumer};
GRANT USAGE ON SEQUENCE {schema}.operator_audit_id_seq TO {consumer};
-- Its running processes beat in consumer_members and count the records
-- applied per minute in activity; they prune both.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.consumer_members, {schema}.activity TO {consumer};

-- operator: the outbox command line and operator.Store. It reads what the
-- consumers set aside and submits requests (the consumer carries them
-- out), replays and discards the producer's dead events itself (a replay
-- puts the event back into events), and audits each action.
GRANT SELECT ON {schema}.processed_keys, {schema}.positions, {schema}.parked, {schema}.dead_letters TO {operator};
GRANT SELECT, INSERT, UPDATE ON {schema}.operator_requests TO {operator};
GRANT SELECT, INSERT ON {schema}.operator_audit TO {operator};
GRANT USAGE ON SEQUENCE {schema}.operator_requests_id_seq, {schema}.operator_audit_id_seq TO {operator};
GRANT SELECT, UPDATE ON {schema}.dead_events TO {operator};
GRANT SELECT, INSERT ON {schema}.events TO {operator};
GRANT SELECT ON {schema}.health TO {operator};
-- It says which consumers run (a request to one that never ran would wait).
GRANT SELECT ON {schema}.consumer_members TO {operator};
-- It moves aggregates between shards (package move, outbox move): it
-- closes and opens their sequences, records each step in moves and
-- releases the events the target held.
GRANT SELECT, INSERT, UPDATE ON {schema}.moves, {schema}.sequences TO {operator};
GRANT UPDATE ON {schema}.events TO {operator};
GRANT SELECT ON {schema}.dispatch TO {operator};

-- dashboard: package dashboard served read-only (outbox dashboard). It
-- reads every table and writes nothing.
GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {dashboard};
