package dashboard

import (
	"net/http"
	"net/url"

	"github.com/d419a114/outbox/ordering"
)

// gapsData is the gaps page's data.
type gapsData struct {
	Consumer string
	// Count is how many gaps are open, capped at the page size.
	Count string
	Gaps  []gapView
}

// gapView is one open gap with the first records parked behind it.
type gapView struct {
	ordering.OpenGap
	Parked []ordering.Parked
	// Letter is the page of the open dead letter inside the gap; ""
	// when there is none.
	Letter string
	// Resolve is its confirmation page.
	Resolve string
}

func (d *Dashboard) gaps(w http.ResponseWriter, r *http.Request) {
	consumer := r.PathValue("consumer")
	tr, err := ordering.New(consumer, &ordering.Config{Schema: d.cfg.Schema})
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	gs, err := tr.ListGaps(r.Context(), d.pool, d.cfg.PageSize+1)
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	data := gapsData{Consumer: consumer, Count: capped(int64(len(gs)), d.cfg.PageSize)}
	if len(gs) > d.cfg.PageSize {
		gs = gs[:d.cfg.PageSize]
	}
	for _, g := range gs {
		v := gapView{OpenGap: g}
		if g.Parked > 0 {
			if v.Parked, err = tr.ListParked(r.Context(), d.pool, g.Aggregate, g.Last, maxSuccessors); err != nil {
				d.fail(w, r, http.StatusInternalServerError, err)
				return
			}
		}
		if g.DeadLetterID != 0 {
			v.Letter = d.consumerPath(consumer, "/letters/"+itoa(g.DeadLetterID))
		}
		q := url.Values{"action": {"resolve_gap"}, "aggregate_type": {g.Aggregate.Type}, "aggregate_id": {g.Aggregate.ID}}
		v.Resolve = d.consumerPath(consumer, "/confirm?"+q.Encode())
		data.Gaps = append(data.Gaps, v)
	}
	d.render(w, r, "gaps", "Gaps of "+consumer, &data)
}
