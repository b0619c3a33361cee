package dashboard

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/producer"
)

// deadEventsData is the producer dead events page's data.
type deadEventsData struct {
	Status, AggregateType, AggregateID string
	Events                             []deadEvent
	Next                               string
}

// deadEvent is one dead event with its payload's views and confirmation
// pages ("" when it is not dead).
type deadEvent struct {
	producer.DeadEvent
	Payload         value
	Replay, Discard string
}

// deadEventsFilter reads the page's filter from q.
func deadEventsFilter(q url.Values) (deadletter.ListOpts, error) {
	o := deadletter.ListOpts{Status: deadletter.Status(q.Get("status")), AggregateType: q.Get("aggregate_type"), AggregateID: q.Get("aggregate_id")}
	switch o.Status {
	case "":
		o.Status = deadletter.StatusDead
	case "all":
		o.Status = ""
	case deadletter.StatusDead, deadletter.StatusReplayed, deadletter.StatusDiscarded:
	default:
		return o, fmt.Errorf("dashboard: status %q: want dead, replayed, discarded or all", o.Status)
	}
	var err error
	o.AfterID, err = int64Param(q, "after")
	return o, err
}

func (d *Dashboard) deadEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts, err := deadEventsFilter(q)
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	opts.Limit, opts.Brief = d.cfg.PageSize+1, true
	list, err := d.prod.DeadEvents(r.Context(), &opts)
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	data := deadEventsData{Status: q.Get("status"), AggregateType: opts.AggregateType, AggregateID: opts.AggregateID}
	if data.Status == "" {
		data.Status = string(deadletter.StatusDead)
	}
	if len(list) > d.cfg.PageSize {
		list = list[:d.cfg.PageSize]
		v := url.Values{"status": {data.Status}, "aggregate_type": {opts.AggregateType}, "aggregate_id": {opts.AggregateID},
			"after": {itoa(list[len(list)-1].ID)}}
		data.Next = d.cfg.Prefix + "/producer/dead?" + v.Encode()
	}
	for _, e := range list {
		v := deadEvent{DeadEvent: e, Payload: newValue(e.Payload, e.PayloadSize)}
		if e.Status == deadletter.StatusDead {
			v.Replay = d.cfg.Prefix + "/producer/dead/" + itoa(e.ID) + "/confirm?action=replay"
			v.Discard = d.cfg.Prefix + "/producer/dead/" + itoa(e.ID) + "/confirm?action=discard"
		}
		data.Events = append(data.Events, v)
	}
	d.render(w, r, "deadevents", "Producer dead events", &data)
}

// findDeadEvent reads dead event id (a path value).
func (d *Dashboard) findDeadEvent(r *http.Request, id string) (*producer.DeadEvent, error) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n <= 0 {
		return nil, &badRequest{http.StatusBadRequest, fmt.Errorf("dashboard: dead event id %q is not a number", id)}
	}
	list, err := d.prod.DeadEvents(r.Context(), &deadletter.ListOpts{AfterID: n - 1, Limit: 1, Brief: true})
	if err != nil {
		return nil, err
	}
	if len(list) == 0 || list[0].ID != n {
		return nil, &badRequest{http.StatusNotFound, fmt.Errorf("dashboard: dead event %d: %w", n, outbox.ErrNotFound)}
	}
	return &list[0], nil
}

func (d *Dashboard) confirmDeadEvent(w http.ResponseWriter, r *http.Request) {
	e, err := d.findDeadEvent(r, r.PathValue("id"))
	var bad *badRequest
	switch {
	case errors.As(err, &bad):
		d.fail(w, r, bad.status, bad.err)
		return
	case err != nil:
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	action := operator.Action(r.URL.Query().Get("action"))
	data := confirmData{Action: action, Post: d.cfg.Prefix + "/producer/dead/" + itoa(e.ID), Letters: "1", Aggregates: 1,
		Fields: []field{{"action", string(action)}}}
	hold := "Events of its aggregate written after it went out meanwhile (it did not hold them)."
	if e.Hold {
		hold = "The events of " + e.AggregateType + "/" + e.AggregateID + " that wait behind it are then released, in order."
	}
	switch {
	case e.Status != deadletter.StatusDead:
		data.Nothing, data.What = true, fmt.Sprintf("Dead event %d is %s already: there is nothing to do.", e.ID, e.Status)
	case action == operator.Replay:
		data.What = fmt.Sprintf("Put dead event %d (%s, %s/%s seq %d) back into the outbox with its attempts reset; the relay publishes it next. %s",
			e.ID, e.EventType, e.AggregateType, e.AggregateID, e.Seq, hold)
	case action == operator.Discard:
		data.What = fmt.Sprintf("Give dead event %d (%s, %s/%s seq %d) up for good: it is never published, and consumers that check sequences see a gap at %d. %s",
			e.ID, e.EventType, e.AggregateType, e.AggregateID, e.Seq, e.Seq, hold)
	default:
		d.fail(w, r, http.StatusBadRequest, fmt.Errorf("dashboard: action %q: want replay or discard", action))
		return
	}
	if actor, ok := d.actor(r); ok && !data.Nothing {
		if err := d.allow(r, actor, deadEventAct(action, e.ID)); err != nil {
			data.Refused = err.Error()
		}
	}
	d.render(w, r, "confirm", "Confirm: "+string(action)+" dead event "+itoa(e.ID), &data)
}

// actOnDeadEvent replays or discards a dead event at once (no handler is
// needed), with its audit row in the same transaction.
func (d *Dashboard) actOnDeadEvent(w http.ResponseWriter, r *http.Request) {
	actor, ok := d.authorizePost(w, r)
	if !ok {
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, fmt.Errorf("dashboard: dead event id %q is not a number", r.PathValue("id")))
		return
	}
	action := operator.Action(r.PostFormValue("action"))
	act, status, outcome := d.dead.Replay, deadletter.StatusReplayed, operator.OutcomeReplayed
	switch action {
	case operator.Replay:
	case operator.Discard:
		act, status, outcome = d.dead.Discard, deadletter.StatusDiscarded, operator.OutcomeDiscarded
	default:
		d.fail(w, r, http.StatusBadRequest, fmt.Errorf("dashboard: action %q: want replay or discard", action))
		return
	}
	if err := d.allow(r, actor, deadEventAct(action, id)); err != nil {
		d.fail(w, r, http.StatusForbidden, fmt.Errorf("dashboard: %s may not %s dead event %d: %w", actor, action, id, err))
		return
	}
	done, ok := d.submitOnce(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if err := act(ctx, tx, id); err != nil {
			return err
		}
		return d.ops.Record(ctx, tx, &operator.Entry{Actor: actor, Action: action, Outcome: outcome,
			Detail: fmt.Sprintf("producer dead event %d", id)})
	})
	if err != nil {
		done("")
	}
	if errors.Is(err, outbox.ErrNotFound) {
		d.fail(w, r, http.StatusNotFound, err)
		return
	}
	if errors.Is(err, deadletter.ErrResolved) {
		d.fail(w, r, http.StatusConflict, err)
		return
	}
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d.log.InfoContext(ctx, "dashboard: producer dead event "+string(status), slog.Int64("dead_event_id", id), slog.String("actor", actor))
	loc := d.cfg.Prefix + "/producer/dead?status=" + string(status)
	done(loc)
	http.Redirect(w, r, loc, http.StatusSeeOther)
}
