package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/internal/tables"
)

// TestClaimAfterBacklogGrewPastStatistics guards against the stall the
// soak found: the events table was analyzed while its backlog was small, then
// the backlog grew (a burst of writes faster than the relays, or relays
// down for a while). With the statistics saying almost no row is
// undelivered, PostgreSQL plans the claim's two "held back by an earlier
// failed row" anti-joins as a scan of the whole events_undelivered index
// per candidate (filtering attempts > 0) instead of a probe into
// events_blocking: each claim of 100 rows visits backlog x ~200 index
// entries. At a backlog of 83,000 rows the soak measured claims of 15 s
// (EXPLAIN: "Index Scan using events_undelivered on events f ... Rows
// Removed by Filter: 83098, loops=123"), and the relays delivered ~13
// events/s until autovacuum analyzed the table again. The claim now
// computes the blocking aggregates once, in materialized CTEs. The test
// reads the claim's plan (EXPLAIN ANALYZE) rather than timing it: the
// rows it reads from events, over the whole plan, must stay a small
// multiple of its batch, whereas the old plan read the backlog once per
// candidate.
func TestClaimAfterBacklogGrewPastStatistics(t *testing.T) {
	t.Parallel()
	const batch, backlog = 100, 40_000
	ctx := context.Background()
	db := pgtest.New(t, nil)
	events := db.Table("events")
	_, err := db.Pool.Exec(ctx, `ALTER TABLE `+events+` SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	// Statistics of a table with a few delivered rows.
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+events+` (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, published_at)
		SELECT gen_random_uuid(), 'old-' || i, 'account', 'old-' || i, 1, 'scenario.step', '\x00', now() FROM generate_series(1, 1000) i`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ANALYZE `+events)
	require.NoError(t, err)
	// Then a backlog of 40,000 undelivered events over 400 aggregates,
	// some of whose first events failed once (the anti-joins' input).
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+events+` (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload)
		SELECT gen_random_uuid(), 'k-' || i, 'account', 'agg-' || (i % 400), 1 + i / 400, 'scenario.step', '\x00' FROM generate_series(0, $1 - 1) i`, backlog)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE `+events+` SET attempts = 1, next_attempt_at = now() + interval '1 hour'
		WHERE published_at IS NULL AND aggregate_seq = 1 AND aggregate_id IN ('agg-1', 'agg-7', 'agg-99')`)
	require.NoError(t, err)

	for _, pooled := range []bool{false, true} {
		read, _ := claimPlan(t, db, batch, pooled).scanned()
		t.Logf("the claim (pooled %v) read %.0f rows of events", pooled, read)
		require.LessOrEqual(t, read, float64(20*batch), "to claim %d rows of a backlog of %d the claim (pooled %v) read %.0f rows of events", batch, backlog, pooled, read)
	}
}

// claimPlan runs one claim of batch rows over every bucket under EXPLAIN
// ANALYZE, rolls it back, checks that it claimed batch rows and returns its
// plan. The claim runs as a Relay runs it, on a session set up by
// tables.Relay.ClaimSession, or with pooled as a Fleet's shard runs it, in
// a transaction set up by tables.Relay.ClaimPooled.
func claimPlan(t *testing.T, db *pgtest.DB, batch int, pooled bool) *planNode {
	t.Helper()
	ctx := context.Background()
	sql := tables.ProducerFor(db.Schema).Relay
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	// The session's settings must not reach the pool's other users.
	defer func() { require.NoError(t, conn.Conn().Close(ctx)); conn.Release() }()
	if !pooled {
		_, err = conn.Exec(ctx, sql.ClaimSession)
		require.NoError(t, err)
	}
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	if pooled {
		_, err = tx.Exec(ctx, sql.ClaimPooled)
		require.NoError(t, err)
	}
	buckets := make([]int32, tables.RelayBuckets)
	for i := range buckets {
		buckets[i] = int32(i)
	}
	var plan []struct{ Plan planNode }
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql.Claim, buckets, batch, 30_000, []int32{}).Scan(&plan))
	require.Len(t, plan, 1)
	require.InDelta(t, batch, plan[0].Plan.ActualRows, 0, "rows claimed")
	return &plan[0].Plan
}

// TestClaimWalksItsBatchNotTheBacklog checks the claim's plan on a table
// with history, on both layouts: 100,000 delivered events analyzed (so the
// planner expects almost no undelivered row, as after autovacuum analyzed
// a table whose rows were all delivered), then a backlog of 20,000. The
// claim must walk the undelivered index in id order and stop at its batch,
// not read and sort the backlog: before issue 26's fix it read all 20,000
// rows on every claim of 1,000, O(backlog) per claim and O(backlog^2) per
// drain. It runs the claim as a Relay does, on a session set up by
// tables.Relay.ClaimSession, and as a Fleet's shard does, in a transaction
// set up by tables.Relay.ClaimPooled, and reads EXPLAIN ANALYZE.
func TestClaimWalksItsBatchNotTheBacklog(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "partitioned"}[partitioned], func(t *testing.T) {
			t.Parallel()
			const batch, backlog = 1000, 20_000
			ctx := context.Background()
			db := pgtest.New(t, &pgtest.Opts{PartitionEventsByDay: partitioned})
			events := db.Table("events")
			// Autovacuum must not analyze the backlog meanwhile: on the
			// partitioned layout the setting belongs to each partition.
			_, err := db.Pool.Exec(ctx, `
DO $$ DECLARE r record; BEGIN
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
             WHERE c.oid = '`+events+`'::regclass AND c.relkind = 'r'
                OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = '`+events+`'::regclass) LOOP
        EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', r.rel);
    END LOOP;
END $$`)
			require.NoError(t, err)
			insert := `INSERT INTO ` + events + ` (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, published_at)
SELECT gen_random_uuid(), $1 || g, 'account', (g % 400)::text, $2 + g / 400, 'funds.moved', '\x00', $3
FROM generate_series(0, $4 - 1) AS g`
			_, err = db.Pool.Exec(ctx, insert, "old-", 1, time.Now(), 100_000)
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, `ANALYZE `+events)
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, insert, "new-", 1_000, nil, backlog)
			require.NoError(t, err)

			for _, pooled := range []bool{false, true} {
				candidates := claimPlan(t, db, batch, pooled).find("CTE candidates")
				require.NotNil(t, candidates, "the claim's plan has no CTE candidates")
				read, sorts := candidates.scanned()
				require.Zero(t, sorts, "the candidates (pooled %v) are sorted instead of walked in id order", pooled)
				require.LessOrEqual(t, read, float64(2*batch), "to claim %d rows of a backlog of %d the claim (pooled %v) read %.0f", batch, backlog, pooled, read)
			}
		})
	}
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	NodeType       string     `json:"Node Type"`
	SubplanName    string     `json:"Subplan Name"`
	RelationName   string     `json:"Relation Name"`
	ActualRows     float64    `json:"Actual Rows"`
	ActualLoops    float64    `json:"Actual Loops"`
	RemovedByFiler float64    `json:"Rows Removed by Filter"`
	Plans          []planNode `json:"Plans"`
}

// find returns the first node named subplan, depth first.
func (n *planNode) find(subplan string) *planNode {
	if n.SubplanName == subplan {
		return n
	}
	for i := range n.Plans {
		if f := n.Plans[i].find(subplan); f != nil {
			return f
		}
	}
	return nil
}

// scanned returns how many rows of the events table (or its partitions)
// the scans under n read, those their filters removed included, and how
// many sorts there are under n.
func (n *planNode) scanned() (rows float64, sorts int) {
	if n.NodeType == "Sort" {
		sorts++
	}
	if strings.HasPrefix(n.RelationName, "events") {
		rows += (n.ActualRows + n.RemovedByFiler) * max(n.ActualLoops, 1)
	}
	for i := range n.Plans {
		r, s := n.Plans[i].scanned()
		rows, sorts = rows+r, sorts+s
	}
	return rows, sorts
}
