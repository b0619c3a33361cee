package ordering

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/recordsql"
	"github.com/d419a114/outbox/internal/tables"
)

// GapOpts filters and pages ListGaps. Zero fields do not filter.
type GapOpts struct {
	AggregateType, AggregateID string
	// ParkedBefore keeps the gaps whose lowest parked record was parked
	// before it: the ones at least that old.
	ParkedBefore time.Time
	// After pages: the page starts after this aggregate, in (type, id)
	// order; give GapPage.Next of the page before.
	After *Aggregate
	// Limit bounds how many aggregates a page walks. Default 100.
	Limit int
}

// GapPage is a page of a consumer's gaps.
type GapPage struct {
	// Gaps are the open gaps of the page's aggregates, in aggregate order.
	Gaps []OpenGap
	// Next is where the next page starts; nil after the last page. With
	// ParkedBefore set, a page may hold fewer gaps than Limit (even none)
	// and still have a Next.
	Next *Aggregate
}

// ListGaps returns a page of the consumer's gaps: the aggregates with
// records parked behind a missing sequence (or behind an open dead letter
// inside the gap), in (type, id) order, read along an index of those
// aggregates, so that a page costs the same however many records are
// parked. A gap's Since is when its lowest parked record was parked. An
// aggregate held only by an open dead letter beyond its next sequence,
// with nothing parked, is not a gap here: its letter is listed with the
// dead letters (Gaps, unpaged, has both).
func (t *Tracker) ListGaps(ctx context.Context, db outbox.DB, opts *GapOpts) (GapPage, error) {
	o := GapOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Limit <= 0 {
		o.Limit = 100
	}
	var after Aggregate
	if o.After != nil {
		after = *o.After
	}
	var before *time.Time
	if !o.ParkedBefore.IsZero() {
		before = &o.ParkedBefore
	}
	rows, err := db.Query(ctx, t.parked.GapsPage, t.consumer, after.Type, after.ID, tables.Filter(o.AggregateType), tables.Filter(o.AggregateID), before, o.Limit)
	if err != nil {
		return GapPage{}, fmt.Errorf("ordering: list gaps: %w", err)
	}
	var (
		page GapPage
		last Aggregate
		n    int
	)
	for rows.Next() {
		var (
			g     OpenGap
			dl    []int64
			shown bool
		)
		if err := rows.Scan(&g.Aggregate.Type, &g.Aggregate.ID, &g.Last, &g.Parked, &g.FirstParked, &g.Since, &dl, &shown); err != nil {
			rows.Close()
			return GapPage{}, fmt.Errorf("ordering: list gaps: %w", err)
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
		return GapPage{}, fmt.Errorf("ordering: list gaps: %w", err)
	}
	if n == o.Limit {
		page.Next = &last
	}
	return page, nil
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
	rows, err := db.Query(ctx, t.parked.List, t.consumer, agg.Type, agg.ID, afterSeq, limit)
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
