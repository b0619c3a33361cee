package tables

// Parked are the statements on parked, the records waiting for an earlier
// sequence of their aggregate. Parameters: $1 the consumer, and where an
// aggregate is named, $2 and $3 its type and id.
type Parked struct {
	// Park stores the record of sequence $4 ($5 to $13: topic, partition,
	// offset, key, value, header keys and values, timestamp, idempotency
	// key); a record already parked at that sequence makes it insert
	// nothing.
	Park string
	// Pop takes out the parked record next in line (its sequence follows
	// the position), lowers the parked count, and returns it; no row when
	// none is in line.
	Pop string
	// Gap is the hole below aggregate ($2, $3)'s next record, no row when
	// it has none: with parked records, its position, parked count, lowest
	// parked sequence, oldest parked time, and the id and sequence of the
	// lowest open dead letter inside the hole, if any; with nothing parked
	// but its lowest open dead letter beyond the next sequence, its
	// position, count and lowest parked 0, the letter's first failure as
	// the time, and the letter.
	Gap string
	// GapsPage is a page of the aggregates of consumer $1 with records
	// parked: after aggregate ($2, $3) in (type, id) order, of type $4
	// and id $5 where those are not NULL, at most $7 of them, walked along
	// the partial index positions_parked, so a page costs the same with
	// 300,000 parked records as with 3. Each comes with its position, its
	// parked count, its lowest parked sequence and when that record was
	// parked (one primary-key read), the lowest open dead letter inside
	// its gap, and shown: whether it was parked before $6 (NULL: any). A
	// row not shown still moves the page on.
	GapsPage string
	// Ready lists up to $2 aggregates whose next parked record is in line,
	// oldest first.
	Ready string
	// List pages aggregate ($2, $3)'s parked records along the primary key
	// (consumer, aggregate_type, aggregate_id, seq): up to $5 with a
	// sequence above $4. It reads 256 bytes of each key and value and no
	// headers: a listing's memory stays bounded whatever the records hold.
	List string
}

func parked(q func(string) string) Parked {
	return Parked{
		Park: q(`INSERT INTO {schema}.parked (consumer, aggregate_type, aggregate_id, seq, topic, kafka_partition, kafka_offset,
    record_key, value, header_keys, header_values, record_time, idempotency_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) ON CONFLICT DO NOTHING`),
		Pop: q(`WITH next AS (
    DELETE FROM {schema}.parked k USING {schema}.positions p
    WHERE k.consumer = $1 AND k.aggregate_type = $2 AND k.aggregate_id = $3
      AND p.consumer = k.consumer AND p.aggregate_type = k.aggregate_type AND p.aggregate_id = k.aggregate_id
      AND k.seq = p.last_seq + 1
    RETURNING k.seq, k.topic, k.kafka_partition, k.kafka_offset, k.record_key, k.value, k.header_keys, k.header_values,
              k.record_time, k.idempotency_key, k.parked_at
), dec AS (
    UPDATE {schema}.positions SET parked = parked - (SELECT count(*) FROM next)
    WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND EXISTS (SELECT 1 FROM next)
)
SELECT * FROM next`),
		Gap: q(`SELECT p.last_seq, count(*) AS parked, min(k.seq) AS first_parked, min(k.parked_at) AS since,
       (SELECT ARRAY[d.id, d.aggregate_seq] FROM {schema}.dead_letters d WHERE d.consumer = p.consumer AND d.aggregate_type = p.aggregate_type
            AND d.aggregate_id = p.aggregate_id AND d.status = 'dead' AND d.aggregate_seq > p.last_seq AND d.aggregate_seq < min(k.seq)
        ORDER BY d.aggregate_seq LIMIT 1) AS letter
FROM {schema}.positions p JOIN {schema}.parked k USING (consumer, aggregate_type, aggregate_id)
WHERE p.consumer = $1 AND p.aggregate_type = $2 AND p.aggregate_id = $3
GROUP BY p.consumer, p.aggregate_type, p.aggregate_id, p.last_seq
UNION ALL
(SELECT p.last_seq, 0, 0, d.first_failed_at, ARRAY[d.id, d.aggregate_seq]
 FROM {schema}.dead_letters d JOIN {schema}.positions p
   ON p.consumer = d.consumer AND p.aggregate_type = d.aggregate_type AND p.aggregate_id = d.aggregate_id
 WHERE d.consumer = $1 AND d.aggregate_type = $2 AND d.aggregate_id = $3 AND d.status = 'dead' AND d.aggregate_seq > p.last_seq + 1
   AND NOT EXISTS (SELECT 1 FROM {schema}.parked k WHERE k.consumer = $1 AND k.aggregate_type = $2 AND k.aggregate_id = $3)
 ORDER BY d.aggregate_seq LIMIT 1)`),
		GapsPage: q(`WITH held AS (
    SELECT p.aggregate_type, p.aggregate_id, p.last_seq, p.parked
    FROM {schema}.positions p
    WHERE p.consumer = $1 AND p.parked > 0 AND (p.aggregate_type, p.aggregate_id) > ($2::text, $3::text)
      AND ($4::text IS NULL OR p.aggregate_type = $4) AND ($5::text IS NULL OR p.aggregate_id = $5)
    ORDER BY p.aggregate_type, p.aggregate_id
    LIMIT $7
)
SELECT h.aggregate_type, h.aggregate_id, h.last_seq, h.parked, k.seq, k.parked_at,
       (SELECT ARRAY[d.id, d.aggregate_seq] FROM {schema}.dead_letters d WHERE d.consumer = $1 AND d.aggregate_type = h.aggregate_type
            AND d.aggregate_id = h.aggregate_id AND d.status = 'dead' AND d.aggregate_seq > h.last_seq AND d.aggregate_seq < k.seq
        ORDER BY d.aggregate_seq LIMIT 1),
       $6::timestamptz IS NULL OR k.parked_at < $6 AS shown
FROM held h
CROSS JOIN LATERAL (SELECT seq, parked_at FROM {schema}.parked
                    WHERE consumer = $1 AND aggregate_type = h.aggregate_type AND aggregate_id = h.aggregate_id
                    ORDER BY seq LIMIT 1) k
ORDER BY h.aggregate_type, h.aggregate_id`),
		Ready: q(`SELECT k.aggregate_type, k.aggregate_id FROM {schema}.parked k JOIN {schema}.positions p USING (consumer, aggregate_type, aggregate_id)
WHERE k.consumer = $1 AND k.seq = p.last_seq + 1
ORDER BY k.parked_at LIMIT $2`),
		List: q(`
SELECT seq, topic, kafka_partition, kafka_offset, substring(record_key for 256), substring(value for 256),
       NULL::text[], NULL::bytea[], record_time, idempotency_key, parked_at
FROM {schema}.parked
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND seq > $4
ORDER BY seq
LIMIT $5`),
	}
}
