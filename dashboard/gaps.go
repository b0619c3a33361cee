package dashboard

import (
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/d419a114/outbox/ordering"
)

// gapsData is the gaps page's data.
type gapsData struct {
	Consumer string
	// AggregateType, AggregateID and OlderThan are the filter.
	AggregateType, AggregateID, OlderThan string
	Gaps                                  []gapView
	// Next is the next page; "" on the last.
	Next string
}

// gapView is one open gap with the first records parked behind it.
type gapView struct {
	ordering.OpenGap
	// Records are the first records parked behind it.
	Records []ordering.Parked
	// Letter is the page of the open dead letter inside the gap; ""
	// when there is none.
	Letter string
	// Resolve is its confirmation page.
	Resolve string
}

func (d *Dashboard) gaps(w http.ResponseWriter, r *http.Request) {
	consumer := r.PathValue("consumer")
	q := r.URL.Query()
	data := gapsData{Consumer: consumer, AggregateType: q.Get("aggregate_type"), AggregateID: q.Get("aggregate_id"), OlderThan: q.Get("older_than")}
	opts := ordering.GapOpts{Consumer: consumer, AggregateType: data.AggregateType, AggregateID: data.AggregateID, Limit: d.cfg.PageSize}
	if err := checkFilterSize(q); err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if data.OlderThan != "" {
		age, err := time.ParseDuration(data.OlderThan)
		if err != nil || age < 0 {
			d.fail(w, r, http.StatusBadRequest, fmt.Errorf("dashboard: older_than %q: want a duration such as 10m or 2h", data.OlderThan))
			return
		}
		opts.ParkedBefore = time.Now().Add(-age)
	}
	if q.Has("after_type") || q.Has("after_id") {
		opts.After = &ordering.Aggregate{Type: q.Get("after_type"), ID: q.Get("after_id")}
	}
	page, err := d.cons.Gaps(r.Context(), &opts)
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	for _, g := range page.Gaps {
		v := gapView{OpenGap: g}
		if v.Records, err = d.cons.Parked(r.Context(), consumer, g.Aggregate, g.Last, maxSuccessors); err != nil {
			d.fail(w, r, http.StatusInternalServerError, err)
			return
		}
		if g.DeadLetterID != 0 {
			v.Letter = d.consumerPath(consumer, "/letters/"+itoa(g.DeadLetterID))
		}
		rq := url.Values{"action": {"resolve_gap"}, "aggregate_type": {g.Aggregate.Type}, "aggregate_id": {g.Aggregate.ID}}
		v.Resolve = d.consumerPath(consumer, "/confirm?"+rq.Encode())
		data.Gaps = append(data.Gaps, v)
	}
	if page.Next != nil {
		nq := url.Values{"after_type": {page.Next.Type}, "after_id": {page.Next.ID}}
		for _, k := range []string{"aggregate_type", "aggregate_id", "older_than"} {
			if v := q.Get(k); v != "" {
				nq.Set(k, v)
			}
		}
		data.Next = d.consumerPath(consumer, "/gaps?"+nq.Encode())
	}
	d.render(w, r, "gaps", "Gaps of "+consumer, &data)
}
