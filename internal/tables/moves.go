package tables

// Moves are package move's statements on sequences, moves, events and
// dead_events, on the source and the target of a move; see migration 0013.
type Moves struct {
	// DispatchMode reads the schema's dispatch mode ('relay' or 'cdc').
	DispatchMode string
	// Records reads move $1's rows of direction $2 ('out' on the source, 'in' on the target) in key order: aggregate type and id, peer, last_seq, state.
	Records string
	// Unnumbered returns the first aggregate of ($1 types, $2 ids) in key order that the shard never numbered: no sequence row above 0.
	Unnumbered string
	// LockSource locks aggregate ($1, $2)'s sequence row on the source, creating it at 0, and returns last_seq, moved_to, arriving_from and arriving_move ('' for none).
	LockSource string
	// LastMove returns the id of the latest move of aggregate ($1, $2) recorded on the shard in direction $3, if any.
	LastMove string
	// CloseSource marks aggregate ($1, $2) moved to shard $3 and records move $4's 'out' row at last sequence $5.
	CloseSource string
	// LockMove takes move $1's transaction-scoped advisory lock.
	LockMove string
	// InState counts move $1's 'in' rows and returns the least state.
	InState string
	// ReserveNew creates aggregate ($1, $2)'s sequence row reserved by move $4 from shard $3, unless the row exists.
	ReserveNew string
	// LockTarget locks aggregate ($1, $2)'s sequence row and returns last_seq, moved_to, arriving_from and arriving_move ('' for none).
	LockTarget string
	// Reserve reserves aggregate ($1, $2) for move $4 from shard $3 and records the move's 'in' row (prepared, at $5).
	Reserve string
	// OpenTarget sets reserved aggregate ($1, $2) of move $4 to sequence $3 and takes its writes, held; it updates one row, or none when the aggregate is not reserved by the move or is numbered beyond $3.
	OpenTarget string
	// Unreserve ends move $1's reservations that were never opened; the aggregates stay refused, naming the source.
	Unreserve string
	// Undelivered counts the source's undelivered events of move $1's aggregates up to their last sequences.
	Undelivered string
	// Dead lists the source's dead events of move $1's aggregates up to their last sequences.
	Dead string
	// EndArriving ends move $1's arriving, locking the sequence rows in key order like the writers, before ReleaseHeld reads the held events.
	EndArriving string
	// ReleaseHeld makes move $1's held events (last_error LIKE $2) due now.
	ReleaseHeld string
	// SetState sets move $1's rows of direction $2 to state $3.
	SetState string
	// ReopenSource takes the source's writes of move $1's closed aggregates again.
	ReopenSource string
	// List reads the moves recorded on the shard, one row per move and
	// direction, the most recently updated first (ties: the greater move
	// id first), at most $1: id, direction, peer, state, aggregates,
	// started and updated.
	List string
	// Status counts move $1's held events (last_error LIKE $2) on the target and the oldest one's creation time.
	Status string
}

// MovesFor returns the Moves statements on schema.
func MovesFor(schema string) Moves {
	q := func(sql string) string { return Fill(sql, schema) }
	return Moves{
		DispatchMode: q(`SELECT mode FROM {schema}.dispatch`),
		Records: q(`SELECT aggregate_type, aggregate_id, peer, last_seq, state FROM {schema}.moves
WHERE move_id = $1 AND direction = $2 ORDER BY aggregate_type, aggregate_id`),
		Unnumbered: q(`SELECT a.t, a.i FROM unnest($1::text[], $2::text[]) AS a (t, i)
WHERE NOT EXISTS (SELECT 1 FROM {schema}.sequences AS s WHERE s.aggregate_type = a.t AND s.aggregate_id = a.i AND s.last_seq > 0)
ORDER BY a.t, a.i LIMIT 1`),
		// The no-op update locks the row, as a writer's upsert would, and
		// creates it for an aggregate the source never wrote: closed at 0,
		// its first event on the target is 1.
		LockSource: q(`INSERT INTO {schema}.sequences AS s (aggregate_type, aggregate_id, last_seq) VALUES ($1, $2, 0)
ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = s.last_seq
RETURNING last_seq, moved_to, arriving_from, coalesce(arriving_move, '')`),
		LastMove: q(`SELECT move_id FROM {schema}.moves WHERE direction = $3 AND aggregate_type = $1 AND aggregate_id = $2
ORDER BY started_at DESC, move_id LIMIT 1`),
		CloseSource: q(`WITH moved AS (
    UPDATE {schema}.sequences SET moved_to = $3 WHERE aggregate_type = $1 AND aggregate_id = $2
)
INSERT INTO {schema}.moves (move_id, direction, aggregate_type, aggregate_id, peer, last_seq, state)
VALUES ($4, 'out', $1, $2, $3, $5, 'closed')`),
		// Every step on the target takes this lock first, so that a
		// rollback and an open of the same move never both succeed; the
		// close and the rollback's reopen on the source take it too, so
		// that two closes of the same move never both find it unclosed.
		LockMove: `SELECT pg_advisory_xact_lock(hashtext('outbox.move:' || $1))`,
		InState:  q(`SELECT count(*), min(state) FROM {schema}.moves WHERE move_id = $1 AND direction = 'in'`),
		// The insert reserves an aggregate the target never saw; the lock
		// then reads it either way, so a writer of the target that inserted
		// it first is seen (and refused) rather than overwritten.
		ReserveNew: q(`INSERT INTO {schema}.sequences (aggregate_type, aggregate_id, last_seq, moved_to, arriving_from, arriving_move)
VALUES ($1, $2, 0, $3, $3, $4) ON CONFLICT (aggregate_type, aggregate_id) DO NOTHING`),
		LockTarget: q(`SELECT last_seq, moved_to, arriving_from, coalesce(arriving_move, '') FROM {schema}.sequences
WHERE aggregate_type = $1 AND aggregate_id = $2 FOR UPDATE`),
		Reserve: q(`WITH reserved AS (
    UPDATE {schema}.sequences SET moved_to = $3, arriving_from = $3, arriving_move = $4
    WHERE aggregate_type = $1 AND aggregate_id = $2
)
INSERT INTO {schema}.moves (move_id, direction, aggregate_type, aggregate_id, peer, last_seq, state)
VALUES ($4, 'in', $1, $2, $3, $5, 'prepared')`),
		OpenTarget: q(`WITH opened AS (
    UPDATE {schema}.sequences SET last_seq = $3, moved_to = NULL
    WHERE aggregate_type = $1 AND aggregate_id = $2 AND arriving_move = $4 AND last_seq <= $3
    RETURNING 1
)
UPDATE {schema}.moves SET last_seq = $3, state = 'arriving', updated_at = now()
WHERE move_id = $4 AND direction = 'in' AND aggregate_type = $1 AND aggregate_id = $2
  AND EXISTS (SELECT FROM opened)`),
		// The aggregates stay refused here, naming the source (moved_to).
		Unreserve: q(`UPDATE {schema}.sequences s SET arriving_from = NULL, arriving_move = NULL
FROM {schema}.moves m
WHERE m.move_id = $1 AND m.direction = 'in' AND m.state = 'prepared'
  AND s.aggregate_type = m.aggregate_type AND s.aggregate_id = m.aggregate_id AND s.arriving_move = $1`),
		// The events have no index by aggregate; the undelivered ones are
		// few and events_undelivered finds them.
		Undelivered: q(`SELECT count(*) FROM {schema}.events e
JOIN {schema}.moves m ON m.aggregate_type = e.aggregate_type AND m.aggregate_id = e.aggregate_id
WHERE m.move_id = $1 AND m.direction = 'out' AND e.published_at IS NULL AND e.aggregate_seq <= m.last_seq`),
		Dead: q(`SELECT d.id, d.aggregate_type, d.aggregate_id, d.aggregate_seq, d.last_error FROM {schema}.dead_events d
JOIN {schema}.moves m ON m.aggregate_type = d.aggregate_type AND m.aggregate_id = d.aggregate_id
WHERE m.move_id = $1 AND m.direction = 'out' AND d.status = 'dead' AND d.aggregate_seq <= m.last_seq
ORDER BY d.id`),
		// Locks the sequence rows, in key order like the writers, before
		// releaseHeld reads the held events.
		EndArriving: q(`UPDATE {schema}.sequences s SET arriving_from = NULL, arriving_move = NULL
FROM (SELECT aggregate_type, aggregate_id FROM {schema}.moves
      WHERE move_id = $1 AND direction = 'in' ORDER BY aggregate_type, aggregate_id) m
WHERE s.aggregate_type = m.aggregate_type AND s.aggregate_id = m.aggregate_id AND s.arriving_move = $1`),
		ReleaseHeld: q(`UPDATE {schema}.events e SET attempts = 0, next_attempt_at = now(), last_error = NULL
FROM {schema}.moves m
WHERE m.move_id = $1 AND m.direction = 'in' AND e.aggregate_type = m.aggregate_type AND e.aggregate_id = m.aggregate_id
  AND e.published_at IS NULL AND e.next_attempt_at = 'infinity' AND e.last_error LIKE $2`),
		SetState: q(`UPDATE {schema}.moves SET state = $3, updated_at = now()
WHERE move_id = $1 AND direction = $2 AND state <> $3`),
		ReopenSource: q(`UPDATE {schema}.sequences s SET moved_to = NULL
FROM {schema}.moves m
WHERE m.move_id = $1 AND m.direction = 'out' AND m.state = 'closed'
  AND s.aggregate_type = m.aggregate_type AND s.aggregate_id = m.aggregate_id AND s.moved_to = m.peer`),
		// A direction's rows change state together (SetState), so min is
		// their one state, and they share updated_at (migration 0014): the
		// recursive part walks moves_updated newest first, one probe per
		// side of a move, and stops after $1 of them; only those sides'
		// rows are read and counted, each side's on its own by the primary
		// key (LATERAL: joined to the sides, the planner scanned the whole
		// table, expecting the join to keep few rows).
		List: q(`WITH RECURSIVE side AS (
    (SELECT updated_at, move_id, direction FROM {schema}.moves
     ORDER BY updated_at DESC, move_id DESC, direction DESC LIMIT 1)
    UNION ALL
    SELECT n.updated_at, n.move_id, n.direction FROM side CROSS JOIN LATERAL (
        SELECT m.updated_at, m.move_id, m.direction FROM {schema}.moves AS m
        WHERE (m.updated_at, m.move_id, m.direction) < (side.updated_at, side.move_id, side.direction)
        ORDER BY m.updated_at DESC, m.move_id DESC, m.direction DESC LIMIT 1
    ) AS n
), top AS (
    SELECT DISTINCT move_id, direction FROM (SELECT move_id, direction FROM side LIMIT $1) AS s
)
SELECT top.move_id, top.direction, a.peer, a.state, a.n, a.started, a.updated
FROM top CROSS JOIN LATERAL (
    SELECT m.peer, min(m.state) AS state, count(*) AS n, min(m.started_at) AS started, max(m.updated_at) AS updated
    FROM {schema}.moves AS m WHERE m.move_id = top.move_id AND m.direction = top.direction GROUP BY m.peer
) AS a
ORDER BY a.updated DESC, top.move_id DESC, top.direction DESC`),
		Status: q(`SELECT count(*) FILTER (WHERE e.next_attempt_at = 'infinity' AND e.last_error LIKE $2),
       min(e.created_at) FILTER (WHERE e.next_attempt_at = 'infinity' AND e.last_error LIKE $2)
FROM {schema}.events e
JOIN {schema}.moves m ON m.aggregate_type = e.aggregate_type AND m.aggregate_id = e.aggregate_id
WHERE m.move_id = $1 AND m.direction = 'in' AND e.published_at IS NULL`),
	}
}
