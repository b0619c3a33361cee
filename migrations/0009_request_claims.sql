-- 0009: fencing operator requests by their claim, and cancelling them.
--
-- A request's lease used to be the only guard: a process that stalled
-- past it (a long handler, a Rate sleep, a pause) went on writing status
-- and counts after a second process had taken the request up, and the
-- last writer won. claim counts the times a process took the request up;
-- a process writes only WHERE claim is still the number it claimed, so a
-- process that lost the request writes nothing, and an action it was
-- carrying out rolls back (the count of each action is written in the
-- action's own transaction).
--
-- cancelled is an operator's end of a pending or running request
-- (operator.Store.Cancel): no process claims it, and the process carrying
-- it out stops before its next action.
ALTER TABLE operator_requests ADD COLUMN IF NOT EXISTS claim bigint NOT NULL DEFAULT 0;
ALTER TABLE operator_requests DROP CONSTRAINT IF EXISTS operator_requests_status_check;
ALTER TABLE operator_requests ADD CONSTRAINT operator_requests_status_check
    CHECK (status IN ('pending', 'running', 'done', 'failed', 'cancelled'));
