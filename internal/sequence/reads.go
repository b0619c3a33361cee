package sequence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/recordsql"
	"github.com/d419a114/outbox/internal/tables"
	"github.com/d419a114/outbox/ordering"
)

// ListGaps returns a page of the gaps of opts.Consumer (required): the aggregates with
// records parked behind a missing sequence (or behind an open dead letter
// inside the gap), in (type, id) order, read along an index of those
// aggregates, so that a page costs the same however many records are
// parked. A gap's Since is when its lowest parked record was parked. An
// aggregate held only by an open dead letter beyond its next sequence,
// with nothing parked, is not a gap here: its letter is listed with the
// dead letters (Tracker.Gap reads both for one aggregate).
func ListGaps(ctx context.Context, db outbox.DB, sql tables.Parked, opts *ordering.GapOpts) (ordering.GapPage, error) {
	o := ordering.GapOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Consumer == "" {
		return ordering.GapPage{}, errors.New("ordering: list gaps: GapOpts.Consumer is empty; name the consumer whose gaps to read")
	}
	if o.Limit <= 0 {
		o.Limit = 100
	}
	var after ordering.Aggregate
	if o.After != nil {
		after = *o.After
	}
	var before *time.Time
	if !o.ParkedBefore.IsZero() {
		before = &o.ParkedBefore
	}
	rows, err := db.Query(ctx, sql.GapsPage, o.Consumer, after.Type, after.ID, tables.Filter(o.AggregateType), tables.Filter(o.AggregateID), before, o.Limit)
	if err != nil {
		return ordering.GapPage{}, fmt.Errorf("ordering: list gaps: %w", err)
	}
	var (
		page ordering.GapPage
		last ordering.Aggregate
		n    int
	)
	for rows.Next() {
		var (
			g     ordering.OpenGap
			dl    []int64
			shown bool
		)
		if err := rows.Scan(&g.Aggregate.Type, &g.Aggregate.ID, &g.Last, &g.Parked, &g.FirstParked, &g.Since, &dl, &shown); err != nil {
			rows.Close()
			return ordering.GapPage{}, fmt.Errorf("ordering: list gaps: %w", err)
		}
		n++
		last = g.Aggregate
		if !shown {
			continue
		}
		g.Expected = g.Last + 1
		if len(dl) == 2 {
			g.DeadLetterID, g.DeadLetterSeq = dl[0], dl[1]
		}
		page.Gaps = append(page.Gaps, g)
	}
	if err := rows.Err(); err != nil {
		return ordering.GapPage{}, fmt.Errorf("ordering: list gaps: %w", err)
	}
	if n == o.Limit {
		page.Next = &last
	}
	return page, nil
}

// ListParked returns up to limit (default 100) of consumer's parked
// records of agg
// with a sequence above afterSeq, in sequence order: the records a
// resolved gap would release, for an operator to look at. It changes
// nothing. Each Record holds the first 256 bytes of its key and value and
// no headers: it is a listing, bounded whatever the records hold.
func ListParked(ctx context.Context, db outbox.DB, sql tables.Parked, consumer string, agg ordering.Aggregate, afterSeq int64, limit int) ([]ordering.Parked, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.Query(ctx, sql.List, consumer, agg.Type, agg.ID, afterSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("ordering: list parked records of %s: %w", agg, err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ordering.Parked, error) {
		var (
			p       = ordering.Parked{Aggregate: agg, Record: &kgo.Record{}}
			keys    []string
			values  [][]byte
			recTime *time.Time
			idemKey *string
		)
		if err := r.Scan(&p.Seq, &p.Record.Topic, &p.Record.Partition, &p.Record.Offset, &p.Record.Key, &p.Record.Value,
			&keys, &values, &recTime, &idemKey, &p.ParkedAt); err != nil {
			return ordering.Parked{}, err
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

// Position returns consumer's last applied sequence of agg, 0 and false
// when it has none.
func Position(ctx context.Context, db outbox.DB, sql tables.Positions, consumer string, agg ordering.Aggregate) (int64, bool, error) {
	return position(ctx, db, sql.Read, consumer, agg)
}

func position(ctx context.Context, db outbox.DB, read, consumer string, agg ordering.Aggregate) (int64, bool, error) {
	var last int64
	err := db.QueryRow(ctx, read, consumer, agg.Type, agg.ID).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("ordering: read position of %s: %w", agg, err)
	}
	return last, true, nil
}
