package tables

// Positions are the statements on positions, the last sequence applied per
// consumer and aggregate. Parameters: $1 the consumer, $2 and $3 the
// aggregate's type and id.
type Positions struct {
	// Advance is the hot path in one statement: it moves an existing
	// position from $4-1 to $4, or creates the position of an aggregate
	// never seen (at seq 1, or at any seq when $5 says baseline), and
	// returns the parked count. Both branches see one snapshot; the insert
	// runs only when the update matched nothing, and ON CONFLICT DO NOTHING
	// makes it a no-op when the row exists at another sequence (or a
	// concurrent transaction just created it): no row leaves the slow path
	// to classify.
	Advance string
	// Lock reads last_seq and parked FOR UPDATE: a verdict on them holds
	// until the transaction ends.
	Lock string
	// Read reads last_seq.
	Read string
	// SetLast moves the position up to $4, never down.
	SetLast string
	// Hold creates the position at $4 unless it exists.
	Hold string
	// SkipTo moves the position up to $4 and returns the parked count; no
	// row when it was at or past $4.
	SkipTo string
	// BumpParked counts one more parked record. A strict first sighting
	// parks before any position exists: it creates it at 0 so the count has
	// a home and seq 1 takes the hot path.
	BumpParked string
}

func positions(q func(string) string) Positions {
	const key = `consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3`
	return Positions{
		Advance: q(`WITH up AS (
    UPDATE {schema}.positions SET last_seq = $4::bigint, updated_at = now()
    WHERE ` + key + ` AND last_seq = $4::bigint - 1
    RETURNING parked
), ins AS (
    INSERT INTO {schema}.positions (consumer, aggregate_type, aggregate_id, last_seq)
    SELECT $1, $2, $3, $4::bigint WHERE ($4::bigint = 1 OR $5) AND NOT EXISTS (SELECT 1 FROM up)
    ON CONFLICT DO NOTHING
    RETURNING parked
)
SELECT parked FROM up UNION ALL SELECT parked FROM ins`),
		Lock:    q(`SELECT last_seq, parked FROM {schema}.positions WHERE ` + key + ` FOR UPDATE`),
		Read:    q(`SELECT last_seq FROM {schema}.positions WHERE ` + key),
		SetLast: q(`UPDATE {schema}.positions SET last_seq = $4, updated_at = now() WHERE ` + key + ` AND last_seq < $4`),
		Hold:    q(`INSERT INTO {schema}.positions (consumer, aggregate_type, aggregate_id, last_seq) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`),
		SkipTo:  q(`UPDATE {schema}.positions SET last_seq = $4, updated_at = now() WHERE ` + key + ` AND last_seq < $4 RETURNING parked`),
		BumpParked: q(`INSERT INTO {schema}.positions AS p (consumer, aggregate_type, aggregate_id, last_seq, parked) VALUES ($1, $2, $3, 0, 1)
ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE SET parked = p.parked + 1, updated_at = now()`),
	}
}
