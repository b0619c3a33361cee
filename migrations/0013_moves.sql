-- 0013: move an aggregate from one shard to another (package move).
--
-- An aggregate's events must keep one sequence and one order across the
-- move. The target first reserves the aggregate (moved_to names the
-- source, arriving_from too: writes there are refused until it opens),
-- so that no write on the target can number the aggregate on its own
-- while the source closes it. The source shard then closes the aggregate: sequences.moved_to names
-- the shard it went to, and the writer's upsert, which updates only rows
-- where moved_to is NULL, then writes nothing for it (Write reports
-- producer.ErrAggregateMoved). The target opens it at the source's last
-- sequence (moved_to cleared, arriving_from kept): events written there while
-- the source still delivers the earlier ones are inserted held (attempts
-- 1, next_attempt_at 'infinity', last_error saying why), which the relay's
-- claim already skips, and released in one transaction once the source
-- delivered everything. Both columns are NULL on every existing row, so
-- nothing changes for aggregates that never move.
--
-- moves records each step per aggregate on both shards (direction 'out'
-- on the source, 'in' on the target), so that a move interrupted at any
-- point is resumed, or rolled back, from what the two tables say.
ALTER TABLE sequences ADD COLUMN IF NOT EXISTS moved_to text;
ALTER TABLE sequences ADD COLUMN IF NOT EXISTS arriving_from text;
ALTER TABLE sequences ADD COLUMN IF NOT EXISTS arriving_move text;

CREATE TABLE IF NOT EXISTS moves (
    move_id        text        NOT NULL,
    direction      text        NOT NULL CHECK (direction IN ('out', 'in')),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    peer           text        NOT NULL,
    last_seq       bigint      NOT NULL,
    state          text        NOT NULL CHECK (state IN ('prepared', 'closed', 'arriving', 'done', 'rolled_back')),
    started_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (move_id, direction, aggregate_type, aggregate_id)
);
