-- 0012: find a record by its idempotency key, see a letter's history, and
-- read the overview's ages along indexes.
--
-- An operator who has only an event's key (from a customer's complaint, a
-- log line) could not find its letter or its parked record without reading
-- them all. These indexes let the dashboard's search find both by
-- (consumer, key) in one index read; processed_keys already has that key.
--
-- The dashboard's overview reads, per consumer, how old its oldest open
-- letter and its oldest parked record are; without an index each read
-- sorted every open letter (a second with a million).
--
-- A letter kept only its newest error: a record that failed on three
-- deliveries with three different errors showed the last. history keeps
-- each failure (when, the tries of that delivery, the first 1,024
-- characters of its error), the newest 20, appended by the same statement
-- that stores the letter.
CREATE INDEX IF NOT EXISTS dead_letters_key ON dead_letters (consumer, idempotency_key);
CREATE INDEX IF NOT EXISTS parked_key ON parked (consumer, idempotency_key);
CREATE INDEX IF NOT EXISTS dead_letters_open_age ON dead_letters (consumer, first_failed_at) WHERE status = 'dead';
CREATE INDEX IF NOT EXISTS parked_age ON parked (consumer, parked_at);
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS history jsonb NOT NULL DEFAULT '[]';
