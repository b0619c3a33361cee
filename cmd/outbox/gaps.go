package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

// gapRow is an open gap as the gaps command writes it in JSON.
type gapRow struct {
	Consumer      string    `json:"consumer"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Last          int64     `json:"last_applied"`
	Expected      int64     `json:"expected"`
	FirstParked   int64     `json:"first_parked,omitempty"`
	Parked        int       `json:"parked"`
	Since         time.Time `json:"since"`
	DeadLetterID  int64     `json:"dead_letter_id,omitempty"`
	DeadLetterSeq int64     `json:"dead_letter_seq,omitempty"`
}

// gaps reads up to -limit open gaps of -consumer, or of every consumer,
// filtered by -aggregate-type and -aggregate-id; more says whether there
// were more.
func gaps(ctx context.Context, e *env) (rows []gapRow, more bool, err error) {
	names := []string{e.consumer}
	if e.consumer == "" {
		var err error
		if names, err = e.reads.Consumers(ctx); err != nil {
			return nil, false, err
		}
	}
	rows = []gapRow{}
	for _, n := range names {
		if len(rows) >= e.limit {
			return rows, true, nil
		}
		page, err := e.reads.Gaps(ctx, &ordering.GapOpts{Consumer: n, AggregateType: e.aggType, AggregateID: e.aggID, Limit: e.limit - len(rows)})
		if err != nil {
			return nil, false, err
		}
		more = page.Next != nil
		for _, g := range page.Gaps {
			rows = append(rows, gapRow{Consumer: n, AggregateType: g.Aggregate.Type, AggregateID: g.Aggregate.ID, Last: g.Last,
				Expected: g.Expected, FirstParked: g.FirstParked, Parked: g.Parked, Since: g.Since,
				DeadLetterID: g.DeadLetterID, DeadLetterSeq: g.DeadLetterSeq})
		}
	}
	return rows, more, nil
}

func gapsList(ctx context.Context, e *env) error {
	rows, more, err := gaps(ctx, e)
	if err != nil {
		return err
	}
	if e.format == "json" {
		return e.writeJSON(rows)
	}
	cells := make([][]string, 0, len(rows))
	for _, g := range rows {
		end := g.FirstParked - 1
		if g.FirstParked == 0 {
			end = g.DeadLetterSeq - 1
		}
		missing := fmt.Sprintf("%d..%d", g.Expected, end)
		letter := "-"
		if g.DeadLetterID != 0 {
			letter = fmt.Sprintf("%d (seq %d)", g.DeadLetterID, g.DeadLetterSeq)
		}
		cells = append(cells, []string{g.Consumer, g.AggregateType + "/" + g.AggregateID, missing, strconv.Itoa(g.Parked), ago(g.Since), letter})
	}
	if err := e.table([]string{"CONSUMER", "AGGREGATE", "MISSING", "PARKED", "AGE", "DEAD LETTER"}, cells, []int{14, 24, 0, 0, 0, 0}); err != nil {
		return err
	}
	if more {
		_, err = fmt.Fprintf(e.out, "more gaps than -limit %d: filter by -consumer or -aggregate-id, or raise -limit\n", e.limit)
	}
	return err
}

func gapResolve(ctx context.Context, e *env) error {
	if e.consumer == "" || e.aggID == "" {
		return usageError("gaps resolve needs -consumer, -aggregate-type and -aggregate-id")
	}
	rows, _, err := gaps(ctx, e)
	if err != nil {
		return err
	}
	agg := ordering.Aggregate{Type: e.aggType, ID: e.aggID}
	var found *gapRow
	for i := range rows {
		if rows[i].AggregateType == agg.Type && rows[i].AggregateID == agg.ID {
			found = &rows[i]
		}
	}
	if found == nil {
		return withCode(exitNotFound, fmt.Errorf("consumer %s has no open gap at %s", e.consumer, agg))
	}
	fmt.Fprintf(e.out, "resolve the gap of %s for %s: skip from %d; %d parked records may drain\n", safe(agg.String()), safe(e.consumer), found.Expected, found.Parked)
	if found.DeadLetterID != 0 && found.DeadLetterSeq == found.Expected {
		return withCode(exitFailed, fmt.Errorf("the gap is dead letter %d: replay or discard it instead (outbox letters replay %d)", found.DeadLetterID, found.DeadLetterID))
	}
	if e.dryRun {
		return nil
	}
	return e.submit(ctx, &operator.Request{Consumer: e.consumer, Action: operator.ResolveGap, RequestedBy: e.by,
		Letters: deadletter.ListOpts{AggregateType: agg.Type, AggregateID: agg.ID}})
}
