package ordering

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/recordsql"
)

// listGapsSQL bounds the Gaps statement ($1 the consumer) to $2 rows. The
// order is repeated outside: a subquery's ORDER BY does not bind the
// query around it.
const listGapsSQL = `SELECT * FROM (%s) AS g ORDER BY since, aggregate_type, aggregate_id LIMIT $2`

// listParkedSQL pages an aggregate's parked records along the parked
// table's primary key (consumer, aggregate_type, aggregate_id, seq). It
// reads 256 bytes of each key and value and no headers: a listing's memory
// stays bounded whatever the records hold.
const listParkedSQL = `
SELECT seq, topic, kafka_partition, kafka_offset, substring(record_key for 256), substring(value for 256),
       NULL::text[], NULL::bytea[], record_time, idempotency_key, parked_at
FROM %s.parked
WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND seq > $4
ORDER BY seq
LIMIT $5`

// ListGaps is Gaps returning at most limit gaps (default 100), oldest
// first, for a page that must stay small however many aggregates wait.
func (t *Tracker) ListGaps(ctx context.Context, db outbox.DB, limit int) ([]OpenGap, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.Query(ctx, fmt.Sprintf(listGapsSQL, t.parked.Gaps), t.consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("ordering: list gaps: %w", err)
	}
	gaps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OpenGap, error) {
		var (
			g  OpenGap
			dl []int64
		)
		if err := r.Scan(&g.Aggregate.Type, &g.Aggregate.ID, &g.Last, &g.Parked, &g.FirstParked, &g.Since, &dl); err != nil {
			return OpenGap{}, err
		}
		g.Expected = g.Last + 1
		if len(dl) == 2 {
			g.DeadLetterID, g.DeadLetterSeq = dl[0], dl[1]
		}
		return g, nil
	})
	if err != nil {
		return nil, fmt.Errorf("ordering: list gaps: %w", err)
	}
	return gaps, nil
}

// ListParked returns up to limit (default 100) of agg's parked records
// with a sequence above afterSeq, in sequence order: the records a
// resolved gap would release, for an operator to look at. It changes
// nothing. Each Record holds the first 256 bytes of its key and value and
// no headers: it is a listing, bounded whatever the records hold.
func (t *Tracker) ListParked(ctx context.Context, db outbox.DB, agg Aggregate, afterSeq int64, limit int) ([]Parked, error) {
	if limit <= 0 {
		limit = 100
	}
	schema := pgx.Identifier{t.cfg.Schema}.Sanitize()
	rows, err := db.Query(ctx, fmt.Sprintf(listParkedSQL, schema), t.consumer, agg.Type, agg.ID, afterSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("ordering: list parked records of %s: %w", agg, err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Parked, error) {
		var (
			p       = Parked{Aggregate: agg, Record: &kgo.Record{}}
			keys    []string
			values  [][]byte
			recTime *time.Time
			idemKey *string
		)
		if err := r.Scan(&p.Seq, &p.Record.Topic, &p.Record.Partition, &p.Record.Offset, &p.Record.Key, &p.Record.Value,
			&keys, &values, &recTime, &idemKey, &p.ParkedAt); err != nil {
			return Parked{}, err
		}
		p.Record.Headers = recordsql.Join(keys, values)
		if recTime != nil {
			p.Record.Timestamp = *recTime
		}
		if idemKey != nil {
			p.IdempotencyKey = *idemKey
		}
		return p, nil
	})
	if err != nil {
		return nil, fmt.Errorf("ordering: list parked records of %s: %w", agg, err)
	}
	return list, nil
}
