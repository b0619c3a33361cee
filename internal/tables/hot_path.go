package tables

// HotPath are the consumer's statements that touch processed_keys and
// positions at once, so that a record's SDK work is one statement that can
// travel in the round trip of BEGIN. Parameters: $1 the consumer.
type HotPath struct {
	// ClaimAdvance claims key $5 and, only if the claim inserted a row (a
	// duplicate key must not move it), moves aggregate ($2, $3) from $4-1
	// to $4. It returns whether the key was fresh and the parked count when
	// the position moved. Anything else (a duplicate sequence, a gap, an
	// aggregate never seen) returns a NULL count and is left to the slow
	// path; creating positions here too would cost every record an
	// INSERT ... ON CONFLICT branch that only an aggregate's first record
	// needs. ON CONFLICT arbitrates races on the key; the row lock orders
	// racing moves of one position.
	// $6 is the record's identity, stored with the key (see
	// ClaimedIdentity).
	ClaimAdvance string
	// ClaimOnly is ClaimAdvance for a record without a sequence: it claims
	// key $2 with identity $3 and returns whether it was fresh and a NULL
	// count.
	ClaimOnly string
	// ClaimedIdentity reads the identity stored with key $2, NULL for a
	// key claimed without one (before version 15, or by dedupe.Store or
	// a batch). Only a duplicate pays for it.
	ClaimedIdentity string
	// ClaimMany claims the keys $2 (text[]) and returns, in one row, those
	// it inserted, so that it can travel with BEGIN like ClaimAdvance.
	ClaimMany string
	// AdvanceMany moves every aggregate of a batch ($2 types, $3 ids, $4
	// first and $5 last sequences, all arrays) from first-1 to last in one
	// statement; aggregates never seen are created, at 1 or, when $6 says
	// baseline, anywhere. Each position is found by its primary key (the
	// LATERAL ... LIMIT 1 cannot be planned as anything else) and updated
	// by its ctid alone (a TID scan: no other condition on positions
	// offers the planner an index), so that the cost is the batch's,
	// whatever the planner believes of the table. Joined to the batch
	// directly, a consumer's positions were read whole for each batch
	// while its statistics were older than its rows, as they are for a
	// new consumer: 120 ms where this takes 1.5 ms, per batch of 100 at
	// 300,000 positions (with current statistics, 1.2 ms and 1.6 ms). The
	// ctid is the row the lookup found, in the statement's snapshot; a
	// position another transaction moved meanwhile has a new ctid, so it
	// is not moved here (and if it were, only with last_seq still first-1,
	// as before) and the batch goes one record at a time, as when last_seq
	// no longer matched. It returns how many positions moved or were
	// created, and their parked records in all. The caller checked that
	// each aggregate's records are first..last without a hole; it falls
	// back to one record at a time unless the count equals the number of
	// aggregates and nothing is parked.
	AdvanceMany string
}

func hotPath(q func(string) string) HotPath {
	return HotPath{
		ClaimAdvance: q(`WITH claim AS (
    INSERT INTO {schema}.processed_keys (consumer, key, identity) VALUES ($1, $5, $6) ON CONFLICT DO NOTHING RETURNING 1
), up AS (
    UPDATE {schema}.positions SET last_seq = $4::bigint, updated_at = now()
    WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND last_seq = $4::bigint - 1
      AND EXISTS (SELECT 1 FROM claim)
    RETURNING parked
)
SELECT EXISTS (SELECT 1 FROM claim), (SELECT parked FROM up)`),
		ClaimOnly: q(`WITH claim AS (
    INSERT INTO {schema}.processed_keys (consumer, key, identity) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM claim), NULL::integer`),
		ClaimedIdentity: q(`SELECT identity FROM {schema}.processed_keys WHERE consumer = $1 AND key = $2`),
		ClaimMany: q(`WITH claim AS (
    INSERT INTO {schema}.processed_keys (consumer, key) SELECT $1, k FROM unnest($2::text[]) AS k
    ON CONFLICT DO NOTHING RETURNING key
)
SELECT coalesce(array_agg(key), '{}') FROM claim`),
		AdvanceMany: q(`WITH v AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS v (t, i, first, last)
), cur AS (
    SELECT v.*, x.tid FROM v CROSS JOIN LATERAL (
        SELECT p.ctid AS tid FROM {schema}.positions AS p
        WHERE p.consumer = $1 AND p.aggregate_type = v.t AND p.aggregate_id = v.i LIMIT 1
    ) AS x
), up AS (
    UPDATE {schema}.positions AS p SET last_seq = cur.last, updated_at = now()
    FROM cur
    WHERE p.ctid = ANY (ARRAY(SELECT tid FROM cur)) AND p.ctid = cur.tid AND p.last_seq = cur.first - 1
    RETURNING p.aggregate_type, p.aggregate_id, p.parked
), ins AS (
    INSERT INTO {schema}.positions (consumer, aggregate_type, aggregate_id, last_seq)
    SELECT $1, v.t, v.i, v.last FROM v
    WHERE (v.first = 1 OR $6) AND NOT EXISTS (SELECT 1 FROM up WHERE up.aggregate_type = v.t AND up.aggregate_id = v.i)
    ON CONFLICT DO NOTHING
    RETURNING parked
)
SELECT count(*), coalesce(sum(parked), 0) FROM (SELECT parked FROM up UNION ALL SELECT parked FROM ins) AS moved`),
	}
}
