-- 0014: moves listed and looked up without reading the whole table.
--
-- outbox moves (move.List) grouped every row of moves, one per aggregate
-- and side of every move ever made, to show the latest few; and a move
-- refused because an aggregate moved before looked its latest move up
-- by reading the table too. Every step of a move writes all the rows of
-- its side in one transaction, so they share updated_at: the first index
-- lets List walk the sides newest first, one index probe each, and read
-- only the rows of the moves it lists; the second finds an aggregate's
-- moves.
CREATE INDEX IF NOT EXISTS moves_updated ON moves (updated_at, move_id, direction);
CREATE INDEX IF NOT EXISTS moves_aggregate ON moves (aggregate_type, aggregate_id, direction, started_at);
