package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/tables"
	"github.com/d419a114/outbox/ordering"
)

// searchLimit bounds each kind of result the search page lists.
const searchLimit = 20

// searchData is the search page's data: what consumer's tables hold of
// one aggregate, or of one idempotency key.
type searchData struct {
	Consumer                        string
	AggregateType, AggregateID, Key string
	// Searched says a search ran (the form was filled).
	Searched bool
	// Position is the aggregate's last applied sequence; HasPosition
	// says it has one.
	Position    int64
	HasPosition bool
	Gap         *ordering.OpenGap
	Parked      []ordering.Parked
	// Letters are the open letters of the aggregate, or the letters of
	// the key in any status.
	Letters []*deadletter.Letter
	// ProcessedAt is when the key was claimed: its record applied (or
	// parked, or its letter discarded); nil when it is not.
	ProcessedAt *time.Time
}

func (d *Dashboard) search(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if err := checkFilterSize(q); err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	data := searchData{Consumer: r.PathValue("consumer"), AggregateType: q.Get("aggregate_type"), AggregateID: q.Get("aggregate_id"), Key: q.Get("key")}
	var err error
	switch {
	case data.Key != "":
		data.Searched = true
		err = d.searchKey(r.Context(), &data)
	case data.AggregateID != "" && data.AggregateType == "":
		d.fail(w, r, http.StatusBadRequest, errors.New("dashboard: give the aggregate's type with its id: the tables are kept by both"))
		return
	case data.AggregateID != "":
		data.Searched = true
		err = d.searchAggregate(r.Context(), &data)
	}
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d.render(w, r, "search", "Search "+data.Consumer, &data)
}

// searchAggregate fills data with what the tables hold of its aggregate:
// its position, its gap and parked records, its open letters.
func (d *Dashboard) searchAggregate(ctx context.Context, data *searchData) error {
	agg := ordering.Aggregate{Type: data.AggregateType, ID: data.AggregateID}
	var err error
	if data.Position, data.HasPosition, err = d.cons.Position(ctx, data.Consumer, agg); err != nil {
		return err
	}
	page, err := d.cons.Gaps(ctx, &ordering.GapOpts{Consumer: data.Consumer, AggregateType: agg.Type, AggregateID: agg.ID, Limit: 1})
	if err != nil {
		return err
	}
	if len(page.Gaps) == 1 {
		data.Gap = &page.Gaps[0]
	}
	if data.Parked, err = d.cons.Parked(ctx, data.Consumer, agg, 0, searchLimit); err != nil {
		return err
	}
	data.Letters, err = d.cons.Letters(ctx, &deadletter.ListOpts{Consumer: data.Consumer, Status: deadletter.StatusDead,
		AggregateType: agg.Type, AggregateID: agg.ID, Limit: searchLimit, Brief: true})
	return err
}

// searchKey fills data with what the tables hold of its key: its claim,
// its letters in any status, the records parked with it.
func (d *Dashboard) searchKey(ctx context.Context, data *searchData) error {
	var parked [][]string
	err := d.pool.QueryRow(ctx, tables.For(d.cfg.Schema).Reads.SearchKey, data.Consumer, data.Key).Scan(&data.ProcessedAt, &parked)
	if err != nil {
		return fmt.Errorf("dashboard: search key: %w", err)
	}
	for _, p := range parked {
		var seq int64
		if _, err := fmt.Sscan(p[2], &seq); err != nil {
			return fmt.Errorf("dashboard: search key: parked seq %q: %w", p[2], err)
		}
		recs, err := d.cons.Parked(ctx, data.Consumer, ordering.Aggregate{Type: p[0], ID: p[1]}, seq-1, 1)
		if err != nil {
			return err
		}
		data.Parked = append(data.Parked, recs...)
	}
	data.Letters, err = d.cons.Letters(ctx, &deadletter.ListOpts{Consumer: data.Consumer, IdempotencyKey: data.Key,
		Limit: searchLimit, Brief: true})
	if err != nil {
		return err
	}
	return nil
}
