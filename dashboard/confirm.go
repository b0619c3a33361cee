package dashboard

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

// maxRefs bounds the letters a bulk confirmation lists by name.
const maxRefs = 20

// confirmData is a confirmation page's data: what the action will touch,
// and the form that asks for it.
type confirmData struct {
	Consumer string
	Action   operator.Action
	// What says in one sentence what will happen.
	What string
	// Letters counts the letters acted on (capped), Aggregates their
	// aggregates, Parked the records parked behind them; AtLeast is set
	// when the count stopped at [Config.CountCap], and the other two count
	// only the letters read.
	Letters            string
	AtLeast            bool
	Aggregates, Parked int64
	// Letter is the one letter of a single action.
	Letter *deadletter.Letter
	// Refs are the first letters of a bulk action, in the order it takes
	// them; More is set when there are others.
	Refs []deadletter.Ref
	More bool
	// Successors are the first records parked behind the letter or gap,
	// Drains how many of them are released at once.
	Successors []ordering.Parked
	Drains     int
	// Fields are the form's hidden fields, Post where it goes; Nothing
	// is set when there is nothing to act on.
	Fields  []field
	Post    string
	Nothing bool
	// Refused is why [Config.Allow] refused the actor this action; "" when
	// it did not.
	Refused string
}

type field struct{ Name, Value string }

func (d *Dashboard) confirm(w http.ResponseWriter, r *http.Request) {
	consumer := r.PathValue("consumer")
	q := r.URL.Query()
	data := confirmData{Consumer: consumer, Action: operator.Action(q.Get("action")), Post: d.consumerPath(consumer, "/requests")}
	var err error
	switch {
	case data.Action == operator.ResolveGap:
		err = d.confirmGap(r, &data, q)
	case data.Action != operator.Replay && data.Action != operator.Discard:
		err = &badRequest{http.StatusBadRequest, fmt.Errorf("dashboard: action %q: want replay, discard or resolve_gap", data.Action)}
	case q.Get("letter") != "":
		err = d.confirmLetter(r, &data, q.Get("letter"))
	default:
		err = d.confirmBulk(r, &data, q)
	}
	var bad *badRequest
	switch {
	case errors.As(err, &bad):
		d.fail(w, r, bad.status, bad.err)
		return
	case err != nil:
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	data.Fields = append([]field{{"action", string(data.Action)}}, data.Fields...)
	if actor, ok := d.actor(r); ok && !data.Nothing {
		form := url.Values{}
		for _, f := range data.Fields {
			form.Set(f.Name, f.Value)
		}
		req, err := requestOf(consumer, form)
		if err != nil {
			d.fail(w, r, http.StatusBadRequest, err)
			return
		}
		if err := d.allow(r, actor, requestAct(req)); err != nil {
			data.Refused = err.Error()
		}
	}
	d.render(w, r, "confirm", "Confirm: "+string(data.Action), &data)
}

func atLeast(b bool) string {
	if b {
		return "at least "
	}
	return ""
}

// badRequest is an error of the client's, answered with status.
type badRequest struct {
	status int
	err    error
}

func (b *badRequest) Error() string { return b.err.Error() }

func (d *Dashboard) confirmLetter(r *http.Request, data *confirmData, id string) error {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return &badRequest{http.StatusBadRequest, fmt.Errorf("dashboard: letter id %q is not a number", id)}
	}
	l, err := d.cons.PeekLetter(r.Context(), n)
	if errors.Is(err, outbox.ErrNotFound) || (err == nil && l.Consumer != data.Consumer) {
		return &badRequest{http.StatusNotFound, fmt.Errorf("dashboard: consumer %q has no dead letter %d", data.Consumer, n)}
	}
	if err != nil {
		return err
	}
	data.Letter, data.Letters, data.Aggregates = l, "1", 1
	data.Fields = []field{{"letter", id}}
	if l.Status != deadletter.StatusDead {
		data.Nothing = true
		data.What = fmt.Sprintf("Letter %d is %s already: there is nothing to %s.", l.ID, l.Status, data.Action)
		return nil
	}
	if l.Seq > 0 {
		succ, err := d.successors(r, data.Consumer, ordering.Aggregate{Type: l.AggregateType, ID: l.AggregateID}, l.Seq)
		if err != nil {
			return err
		}
		// The aggregate's parked count, not just the first listed: its
		// open letters are few, so the bound is never reached in practice.
		p, err := d.cons.PreviewLetters(r.Context(), &deadletter.ListOpts{Consumer: data.Consumer, Status: deadletter.StatusDead,
			AggregateType: l.AggregateType, AggregateID: l.AggregateID, Limit: d.cfg.CountCap + 1})
		if err != nil {
			return err
		}
		data.Successors, data.Drains, data.Parked = succ, drains(succ, l.Seq+1), p.Parked
	}
	drained := strconv.Itoa(data.Drains)
	if data.Drains == maxSuccessors {
		drained = "at least " + drained
	}
	verb := "apply it again through the consumer's handler"
	if data.Action == operator.Discard {
		verb = "give it up for good, without applying it"
	}
	data.What = fmt.Sprintf("Ask consumer %q to %s (letter %d, %s/%s seq %d); then %s parked successors drain in sequence order.",
		data.Consumer, verb, l.ID, l.AggregateType, l.AggregateID, l.Seq, drained)
	return nil
}

func (d *Dashboard) confirmBulk(r *http.Request, data *confirmData, q url.Values) error {
	q.Set("status", string(deadletter.StatusDead))
	f, opts, err := parseFilter(q, data.Consumer)
	if err != nil {
		return &badRequest{http.StatusBadRequest, err}
	}
	count := opts
	count.Limit = d.cfg.CountCap + 1
	p, err := d.cons.PreviewLetters(r.Context(), &count)
	if err != nil {
		return err
	}
	data.Letters, data.Aggregates, data.Parked = capped(p.Letters, d.cfg.CountCap), p.Aggregates, p.Parked
	data.AtLeast = p.Letters > int64(d.cfg.CountCap)
	first := opts
	first.Limit = maxRefs + 1
	if data.Refs, err = d.cons.MatchLetters(r.Context(), &first); err != nil {
		return err
	}
	if len(data.Refs) > maxRefs {
		data.Refs, data.More = data.Refs[:maxRefs], true
	}
	for _, k := range []string{"topic", "aggregate_type", "aggregate_id", "reason", "failure", "failed_after", "failed_before"} {
		if v := q.Get(k); v != "" {
			data.Fields = append(data.Fields, field{k, v})
		}
	}
	which := "the open letters matching the filter"
	if f.empty() {
		which = "every open letter"
		data.Fields = append(data.Fields, field{"all", "1"})
	}
	if p.Letters == 0 {
		data.Nothing = true
		data.What = "No open letter matches: there is nothing to " + string(data.Action) + "."
		return nil
	}
	data.What = fmt.Sprintf("Ask consumer %q to %s %s of consumer %q: %s letters of %s%d aggregates, aggregate by aggregate in sequence order, releasing %s%d parked records; a letter that fails again stops its aggregate.",
		data.Consumer, data.Action, which, data.Consumer, data.Letters, atLeast(data.AtLeast), data.Aggregates, atLeast(data.AtLeast), data.Parked)
	return nil
}

func (d *Dashboard) confirmGap(r *http.Request, data *confirmData, q url.Values) error {
	agg := ordering.Aggregate{Type: q.Get("aggregate_type"), ID: q.Get("aggregate_id")}
	if agg.ID == "" {
		return &badRequest{http.StatusBadRequest, errors.New("dashboard: resolve_gap needs aggregate_type and aggregate_id")}
	}
	data.Fields = []field{{"aggregate_type", agg.Type}, {"aggregate_id", agg.ID}}
	last, _, err := d.cons.Position(r.Context(), data.Consumer, agg)
	if err != nil {
		return err
	}
	succ, err := d.cons.Parked(r.Context(), data.Consumer, agg, last, maxSuccessors)
	if err != nil {
		return err
	}
	letters, err := d.cons.Letters(r.Context(), &deadletter.ListOpts{Consumer: data.Consumer, Status: deadletter.StatusDead,
		AggregateType: agg.Type, AggregateID: agg.ID, Limit: 1, Brief: true})
	if err != nil {
		return err
	}
	data.Successors, data.Parked, data.Aggregates, data.Letters = succ, int64(len(succ)), 1, "0"
	if len(succ) == 0 {
		data.Nothing = true
		data.What = fmt.Sprintf("Aggregate %s of consumer %q has no parked records after its position %d: there is no gap to resolve.", agg, data.Consumer, last)
		return nil
	}
	upTo := succ[0].Seq - 1
	if len(letters) > 0 && letters[0].Seq > last && letters[0].Seq <= upTo {
		data.Letter = letters[0]
		upTo = letters[0].Seq - 1
	}
	if upTo <= last && data.Letter == nil {
		data.Nothing = true
		data.What = fmt.Sprintf("Aggregate %s of consumer %q misses nothing: its parked record at seq %d follows its position %d, so it is next in line; the consumer drains it at its next sweep (within a minute).", agg, data.Consumer, succ[0].Seq, last)
		return nil
	}
	if upTo <= last {
		data.Nothing = true
		data.What = fmt.Sprintf("Aggregate %s waits for its open dead letter %d at seq %d, not for missing records: replay or discard that letter instead.", agg, data.Letter.ID, data.Letter.Seq)
		return nil
	}
	data.Drains = drains(succ, upTo+1)
	drained := strconv.Itoa(data.Drains)
	if len(succ) == maxSuccessors {
		drained = "at least " + drained
	}
	data.What = fmt.Sprintf("Ask consumer %q to give up sequences %d to %d of aggregate %s for good (they are never applied, even if they arrive later), then apply the %s parked records that follow on.",
		data.Consumer, last+1, upTo, agg, drained)
	if data.Letter != nil {
		data.What += fmt.Sprintf(" It stops below open dead letter %d at seq %d, which stays open.", data.Letter.ID, data.Letter.Seq)
	}
	return nil
}

// requestOf reads the operator request a confirmation's form asks of
// consumer.
func requestOf(consumer string, form url.Values) (*operator.Request, error) {
	req := &operator.Request{Consumer: consumer, Action: operator.Action(form.Get("action")), All: form.Get("all") == "1"}
	var err error
	if req.LetterID, err = int64Param(form, "letter"); err != nil {
		return nil, err
	}
	if rate := form.Get("rate"); rate != "" {
		if req.Rate, err = strconv.ParseFloat(rate, 64); err != nil {
			return nil, fmt.Errorf("dashboard: rate %q is not a number of letters per second", rate)
		}
	}
	if _, req.Letters, err = parseFilter(form, consumer); err != nil {
		return nil, err
	}
	return req, nil
}

// submit turns a confirmation's form into an operator request and shows
// the request's page.
func (d *Dashboard) submit(w http.ResponseWriter, r *http.Request) {
	actor, ok := d.authorizePost(w, r)
	if !ok {
		return
	}
	consumer := r.PathValue("consumer")
	req, err := requestOf(consumer, r.PostForm)
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if err := d.allow(r, actor, requestAct(req)); err != nil {
		d.fail(w, r, http.StatusForbidden, fmt.Errorf("dashboard: %s may not %s here: %w", actor, req.Action, err))
		return
	}
	done, ok := d.submitOnce(w, r)
	if !ok {
		return
	}
	id, err := d.ops.Submit(operator.WithActor(r.Context(), actor), d.pool, req)
	if err != nil {
		done("")
	}
	if errors.Is(err, operator.ErrInvalid) {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d.log.InfoContext(r.Context(), "dashboard: operator request submitted", slog.Int64("request_id", id), slog.String("actor", actor),
		slog.String("consumer", consumer), slog.String("action", string(req.Action)), slog.Int64("letter_id", req.LetterID))
	loc := d.cfg.Prefix + "/requests/" + itoa(id)
	done(loc)
	http.Redirect(w, r, loc, http.StatusSeeOther) //nolint:gosec // loc is the configured prefix and a number or a fixed status
}
