package dashboard

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/ordering"
)

// maxFailureGroups bounds the fingerprint groups the letters page shows.
const maxFailureGroups = 20

// lettersData is the letters page's data.
type lettersData struct {
	Consumer string
	Filter   filter
	// Count is how many letters match, capped; Aggregates and Parked what
	// acting on them would touch.
	Count              string
	Aggregates, Parked int64
	// AtLeast is set when Count stopped at [Config.CountCap]: Aggregates
	// and Parked count only the letters read.
	AtLeast  bool
	Failures []failureGroup
	Letters  []*deadletter.Letter
	// Next is the next page's URL, "" on the last page.
	Next string
	// Replay and Discard are the confirmation pages for all matching
	// letters; "" when the filter is not on open letters.
	Replay, Discard string
}

// failureGroup is one fingerprint of a consumer's open letters, with the
// URL that filters the list to it.
type failureGroup struct {
	deadletter.Failure
	URL string
}

func (d *Dashboard) consumerPath(consumer, rest string) string {
	return d.cfg.Prefix + "/consumers/" + url.PathEscape(consumer) + rest
}

func (d *Dashboard) letterList(w http.ResponseWriter, r *http.Request) {
	ctx, consumer := r.Context(), r.PathValue("consumer")
	q := r.URL.Query()
	f, opts, err := parseFilter(q, consumer)
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if opts.AfterID, err = int64Param(q, "after"); err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	data := lettersData{Consumer: consumer, Filter: f}

	count := opts
	count.Limit = d.cfg.CountCap + 1
	p, err := d.cons.PreviewLetters(ctx, &count)
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	data.Count, data.Aggregates, data.Parked = capped(p.Letters, d.cfg.CountCap), p.Aggregates, p.Parked
	data.AtLeast = p.Letters > int64(d.cfg.CountCap)

	fs, err := d.cons.Failures(ctx, consumer, maxFailureGroups)
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	for _, g := range fs {
		v := url.Values{"failure": {g.Failure}}
		data.Failures = append(data.Failures, failureGroup{Failure: g, URL: d.consumerPath(consumer, "/letters?"+v.Encode())})
	}

	opts.Limit = d.cfg.PageSize + 1
	opts.Brief = true
	ls, err := d.cons.Letters(ctx, &opts)
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if len(ls) > d.cfg.PageSize {
		ls = ls[:d.cfg.PageSize]
		v := f.values()
		v.Set("after", strconv.FormatInt(ls[len(ls)-1].ID, 10))
		data.Next = d.consumerPath(consumer, "/letters?"+v.Encode())
	}
	data.Letters = ls
	if opts.Status == deadletter.StatusDead && p.Letters > 0 {
		data.Replay, data.Discard = d.confirmURL(consumer, "replay", f), d.confirmURL(consumer, "discard", f)
	}
	d.render(w, r, "letters", "Dead letters of "+consumer, &data)
}

// confirmURL is the confirmation page of action on the open letters f
// matches.
func (d *Dashboard) confirmURL(consumer, action string, f filter) string {
	v := f.values()
	v.Del("status")
	v.Set("action", action)
	return d.consumerPath(consumer, "/confirm?"+v.Encode())
}

// letterData is one letter's page data.
type letterData struct {
	Letter  *deadletter.Letter
	Headers []header
	Key     value
	Value   value
	// Successors are the first records parked behind it; Drains says how
	// many of them a replay or discard releases at once.
	Successors []ordering.Parked
	Drains     int
	// Replay and Discard are its confirmation pages; "" when it is not
	// open.
	Replay, Discard string
}

// maxSuccessors bounds the parked records shown behind a letter or gap.
const maxSuccessors = 20

func (d *Dashboard) letter(w http.ResponseWriter, r *http.Request) {
	consumer := r.PathValue("consumer")
	l, ok := d.openLetter(w, r, consumer, r.PathValue("id"))
	if !ok {
		return
	}
	data := letterData{Letter: l, Headers: headers(l.Record.Headers), Key: newValue(l.Record.Key, len(l.Record.Key)), Value: newValue(l.Record.Value, l.ValueSize)}
	if l.Seq > 0 {
		succ, err := d.successors(r, consumer, ordering.Aggregate{Type: l.AggregateType, ID: l.AggregateID}, l.Seq)
		if err != nil {
			d.fail(w, r, http.StatusInternalServerError, err)
			return
		}
		data.Successors, data.Drains = succ, drains(succ, l.Seq+1)
	}
	if l.Status == deadletter.StatusDead {
		id := strconv.FormatInt(l.ID, 10)
		data.Replay = d.consumerPath(consumer, "/confirm?action=replay&letter="+id)
		data.Discard = d.consumerPath(consumer, "/confirm?action=discard&letter="+id)
	}
	d.render(w, r, "letter", "Dead letter "+strconv.FormatInt(l.ID, 10), &data)
}

// openLetter reads letter id of consumer, answering r with an error page
// when it cannot.
func (d *Dashboard) openLetter(w http.ResponseWriter, r *http.Request, consumer, id string) (*deadletter.Letter, bool) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, errors.New("dashboard: letter id "+strconv.Quote(id)+" is not a number"))
		return nil, false
	}
	l, err := d.cons.PeekLetter(r.Context(), n)
	if errors.Is(err, outbox.ErrNotFound) || (err == nil && l.Consumer != consumer) {
		d.fail(w, r, http.StatusNotFound, errors.New("dashboard: consumer "+strconv.Quote(consumer)+" has no dead letter "+id))
		return nil, false
	}
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return nil, false
	}
	return l, true
}

// successors reads the first records of agg parked after seq.
func (d *Dashboard) successors(r *http.Request, consumer string, agg ordering.Aggregate, seq int64) ([]ordering.Parked, error) {
	return d.cons.Parked(r.Context(), consumer, agg, seq, maxSuccessors)
}

// drains counts the records of ps, in sequence order, that follow on
// from next without a hole: those a release at next-1 applies at once.
func drains(ps []ordering.Parked, next int64) int {
	n := 0
	for _, p := range ps {
		if p.Seq != next {
			break
		}
		n++
		next++
	}
	return n
}
