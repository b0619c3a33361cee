package tables

// Keys are the statements on processed_keys, one row per key a consumer has
// taken custody of. Parameters: $1 the consumer.
type Keys struct {
	// Claim inserts key $2; a conflict inserts nothing. ON CONFLICT DO
	// NOTHING lets the primary key arbitrate races: the loser waits for the
	// winner's transaction and then inserts nothing.
	Claim string
	// Release deletes key $2.
	Release string
	// Claimed says whether key $2 is claimed.
	Claimed string
	// Prune deletes up to $3 keys processed before $2. ctid batches keep
	// each DELETE bounded; the BRIN index on processed_at finds the old
	// block ranges.
	Prune string
}

func keys(q func(string) string) Keys {
	return Keys{
		Claim:   q(`INSERT INTO {schema}.processed_keys (consumer, key) VALUES ($1, $2) ON CONFLICT DO NOTHING`),
		Release: q(`DELETE FROM {schema}.processed_keys WHERE consumer = $1 AND key = $2`),
		Claimed: q(`SELECT EXISTS (SELECT 1 FROM {schema}.processed_keys WHERE consumer = $1 AND key = $2)`),
		Prune: q(`DELETE FROM {schema}.processed_keys WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {schema}.processed_keys WHERE consumer = $1 AND processed_at < $2 LIMIT $3))`),
	}
}
