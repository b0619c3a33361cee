-- 0003: make each write cheaper. An outbox row is written in every
-- business transaction, so what the insert costs beyond the row itself is
-- paid by the caller's throughput:
--
-- - The commit-time wake-up trigger goes. A deferred row trigger costs an
--   after-trigger queue entry and a PL/pgSQL call with a query of its own
--   for every event; measured at 16 connections, it took about 6% of the
--   commits a business transaction with one Write could do. Write now asks
--   whether a relay is idle inside its own statement, and only now and then
--   (see producer.Writer). Rows inserted by other means wake no relay; the
--   relay's poll finds them.
-- - The stored generated column bucket_hash goes. The executor rebuilt its
--   expression for every insert (another 3-5%), while the relay needs the
--   value only for the rows it claims; it now computes the same hash there.
--
-- Upgrading: relays built before this migration read bucket_hash and stop
-- claiming (they log the error and retry) until they are replaced; writers
-- built before it wake no relay. Relays and writers built after it work
-- with or without it (the hash they compute is the column's expression), so
-- deploy them first and migrate after. Nothing is lost or reordered either
-- way. A view or publication of yours that names bucket_hash makes the
-- DROP fail, and Migrate with it: drop or change it first.
--
-- Both statements lock the events table (and its partitions) exclusively.
-- lock_timeout keeps this migration from waiting behind a long transaction
-- while every writer waits behind it; if it times out, Migrate fails with
-- SQLSTATE 55P03 and changes nothing, and the next run tries again.

SET LOCAL lock_timeout = '5s';
DROP TRIGGER IF EXISTS events_wake_relay ON events;
DROP FUNCTION IF EXISTS wake_relay();
ALTER TABLE events DROP COLUMN IF EXISTS bucket_hash;
RESET lock_timeout;
