package tables

import "github.com/jackc/pgx/v5"

// Retention are the statements of producer.Prune.
type Retention struct {
	// Partitioned says whether the events table of schema $1 is
	// day-partitioned; no row when there is none.
	Partitioned string
	// CreatePartitions creates the partitions of the next $1 days and
	// returns how many it created. Day-partitioned layout only.
	CreatePartitions string
	// DropPartitions drops the partitions that ended before $1 and hold
	// no undelivered event, and returns how many it dropped.
	// Day-partitioned layout only.
	DropPartitions string
	// ForgetStaleRetrying removes the stale entries of retrying_events;
	// see forgetStaleRetrying.
	ForgetStaleRetrying string
	// PruneEvents deletes a chunk of delivered events from a plain events
	// table; see pruneChunk.
	PruneEvents string
	// PruneDefault is PruneEvents on events_default, the partition of a
	// day-partitioned table where rows no day partition takes land.
	// Day-partitioned layout only.
	PruneDefault string
}

// pruneChunk deletes the delivered rows, published before the cutoff
// ($3), among the next chunk of rows in id order after $1, and returns the
// chunk's last id, its size, whether it reached a row created inside the
// window, and how many rows it deleted.
//
// Retention walks the primary key rather than an index on published_at,
// which every write would pay for (see the baseline migration). Rows are created
// in roughly id order and published after they are created, so the walk
// can stop at the first chunk that reaches the window: the rows after it
// were created too recently to be deletable. A row created before the
// cutoff but given a higher id (by a long writer transaction) is left to a
// later run, once the walk gets that far. Each chunk reads its rows by key
// range, and the DELETE finds its rows by key too, whatever the statistics
// say about the table; a concurrent prune of the same rows makes it wait
// for that one's statement and then skip them.
const pruneChunk = `
WITH chunk AS MATERIALIZED (
    SELECT id, created_at, published_at
    FROM {schema}.{table}
    WHERE id > $1
    ORDER BY id
    LIMIT $2
), gone AS (
    DELETE FROM {schema}.{table}
    WHERE id = ANY (ARRAY(SELECT id FROM chunk WHERE published_at < $3))
      AND published_at < $3
    RETURNING 1
)
SELECT coalesce(max(id), 0), count(*), coalesce(bool_or(created_at >= $3), false), (SELECT count(*) FROM gone)
FROM chunk`

// forgetStaleRetrying removes the entries of retrying_events whose
// event is no longer owed after a failure: left by hand, or while a trigger
// was disabled. They hold nothing back (the claim checks each entry again)
// but cost every claim a lookup. Each entry is looked up on its own (the
// LATERAL with LIMIT 1), so that a long list never turns into a scan of
// events. A failure being recorded meanwhile is not visible to this
// statement, nor is its entry, which it therefore leaves alone.
const forgetStaleRetrying = `
DELETE FROM {schema}.retrying_events d
USING {schema}.retrying_events r
LEFT JOIN LATERAL (
    SELECT true AS owed FROM {schema}.events e
    WHERE e.id = r.id AND e.created_at = r.created_at AND e.published_at IS NULL AND e.attempts > 0
    LIMIT 1) x ON true
WHERE d.id = r.id AND x.owed IS NULL`

func retention(q func(string) string, schema string) Retention {
	chunk := func(table string) string {
		return Fill(pruneChunk, schema, "{table}", pgx.Identifier{table}.Sanitize())
	}
	return Retention{
		Partitioned:         `SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(format('%I.events', $1::text))`,
		CreatePartitions:    q(`SELECT {schema}.create_event_partitions($1)`),
		DropPartitions:      q(`SELECT {schema}.drop_event_partitions($1)`),
		ForgetStaleRetrying: q(forgetStaleRetrying),
		PruneEvents:         chunk("events"),
		PruneDefault:        chunk("events_default"),
	}
}
