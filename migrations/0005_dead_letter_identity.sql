-- 0005: a dead letter is one record, not one place in a topic. Until now
-- dead_letters had one row per (consumer, topic, partition, offset), and a
-- second failure there was folded into the first row: right for the same
-- record failing again, wrong for a different record at the same place (a
-- topic deleted and created again, a disaster-recovery cluster with the
-- same names, Process fed from another transport), whose own key, value and
-- headers were then stored nowhere, and whose failure flipped a replayed or
-- discarded letter back to dead.
--
-- A letter now also carries the fingerprint of its record (a SHA-256 of the
-- key, the value and the headers, computed by record_fingerprint below in
-- the database, so that the backfill and every writer agree on it), and the
-- unique key includes it: the same record failing again still updates its
-- letter, a different record gets a letter of its own. The consumer never
-- updates a letter that was replayed or discarded; a record that matches
-- one is a duplicate.
--
-- What this means for consumers already running: docs/upgrading.md.

CREATE FUNCTION record_fingerprint(record_key bytea, value bytea, header_keys text[], header_values bytea[])
RETURNS bytea LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
SELECT sha256(
    -- Each part is length-prefixed (-1 for NULL), so that no two records
    -- encode alike.
    int4send(coalesce(octet_length(record_key), -1)) || coalesce(record_key, ''::bytea) ||
    int4send(coalesce(octet_length(value), -1)) || coalesce(value, ''::bytea) ||
    coalesce((SELECT string_agg(int4send(octet_length(convert_to(h.k, 'UTF8'))) || convert_to(h.k, 'UTF8') ||
                                int4send(coalesce(octet_length(h.v), -1)) || coalesce(h.v, ''::bytea), ''::bytea ORDER BY h.o)
              FROM unnest(header_keys, header_values) WITH ORDINALITY AS h (k, v, o)), ''::bytea))
$fn$;

ALTER TABLE dead_letters ADD COLUMN fingerprint bytea;
UPDATE dead_letters SET fingerprint = record_fingerprint(record_key, value, header_keys, header_values);
ALTER TABLE dead_letters ALTER COLUMN fingerprint SET NOT NULL;
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_consumer_topic_kafka_partition_kafka_offset_key;
CREATE UNIQUE INDEX dead_letters_record ON dead_letters (consumer, topic, kafka_partition, kafka_offset, fingerprint);
