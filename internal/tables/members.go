package tables

// Members are the statements on consumer_members, one row per running
// Consumer, and activity, the per-minute counts of work done.
type Members struct {
	// Beat records member ($1 consumer, $2 member id) alive now, with its
	// group $3, host $4, pid $5, assigned partitions $6 and the records
	// it applied since it started, $7.
	Beat string
	// Leave deletes member ($1 consumer, $2 member id): it stopped.
	Leave string
	// List reads up to $2 members of consumer $1 (every consumer when
	// NULL), newest beat first, with whether each beat within $3 seconds.
	List string
	// PruneGone deletes the rows of members whose last beat is over a day
	// old.
	PruneGone string
	// AddActivity adds $4 to the count of kind $1 (applied, delivered) of
	// name $2 (a consumer) in the minute of $3.
	AddActivity string
	// PruneActivity deletes the minutes over two days old.
	PruneActivity string
	// Activity reads the counts of kind $1 and name $2 since $3, per
	// minute, oldest first (minutes with nothing done are absent).
	Activity string
}

func members(q func(string) string) Members {
	return Members{
		Beat: q(`INSERT INTO {schema}.consumer_members AS m (consumer, member_id, group_name, host, pid, partitions, applied)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (consumer, member_id) DO UPDATE
SET heartbeat_at = now(), partitions = EXCLUDED.partitions, applied = EXCLUDED.applied, group_name = EXCLUDED.group_name`),
		Leave: q(`DELETE FROM {schema}.consumer_members WHERE consumer = $1 AND member_id = $2`),
		List: q(`SELECT consumer, member_id, group_name, host, pid, partitions, applied, started_at, heartbeat_at,
       heartbeat_at > now() - make_interval(secs => $3) AS live
FROM {schema}.consumer_members
WHERE $1::text IS NULL OR consumer = $1
ORDER BY heartbeat_at DESC LIMIT $2`),
		PruneGone: q(`DELETE FROM {schema}.consumer_members WHERE heartbeat_at < now() - interval '1 day'`),
		AddActivity: q(`INSERT INTO {schema}.activity AS a (kind, name, minute, n) VALUES ($1, $2, date_trunc('minute', $3::timestamptz), $4)
ON CONFLICT (kind, name, minute) DO UPDATE SET n = a.n + EXCLUDED.n`),
		PruneActivity: q(`DELETE FROM {schema}.activity WHERE minute < now() - interval '2 days'`),
		Activity:      q(`SELECT minute, n FROM {schema}.activity WHERE kind = $1 AND name = $2 AND minute >= $3 ORDER BY minute`),
	}
}
