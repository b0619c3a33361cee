-- 0012: find a record by its idempotency key, and see a letter's history.
--
-- An operator who has only an event's key (from a customer's complaint, a
-- log line) could not find its letter or its parked record without reading
-- them all. These indexes let the dashboard's search find both by
-- (consumer, key) in one index read; processed_keys already has that key.
--
-- A letter kept only its newest error: a record that failed on three
-- deliveries with three different errors showed the last. history keeps
-- each failure (when, the tries of that delivery, the first 1,024
-- characters of its error), the newest 20, appended by the same statement
-- that stores the letter.
CREATE INDEX IF NOT EXISTS dead_letters_key ON dead_letters (consumer, idempotency_key);
CREATE INDEX IF NOT EXISTS parked_key ON parked (consumer, idempotency_key);
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS history jsonb NOT NULL DEFAULT '[]';
