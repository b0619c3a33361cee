-- 0006: tell a dead relay from a live one at once. Each relay counts the
-- live instances to decide how many buckets it should own, and counted an
-- instance as live until its heartbeat was three RebalanceIntervals old: a
-- relay killed with SIGKILL (or whose host vanished) kept its share of the
-- buckets counted for up to 6 s with the defaults, and the buckets it had
-- held lay free, owned and published by nobody, until then.
--
-- A relay now records the process id of the server backend that holds its
-- bucket locks (its lock session) with every heartbeat, and an instance
-- counts as live only while that backend exists (pg_stat_activity lists
-- every backend's pid to every role). The server ends a backend as soon as
-- its client's connection closes, which the kernel does when the process
-- dies, so the others take the free buckets at their next rebalance. A row
-- without a pid (a relay built before this migration) is judged by its
-- heartbeat alone, as before.
--
-- What this means for relays already running: docs/upgrading.md.

ALTER TABLE relays ADD COLUMN IF NOT EXISTS session_pid integer;
