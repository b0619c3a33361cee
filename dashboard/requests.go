package dashboard

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/operator"
)

// requestsData is the requests page's data.
type requestsData struct {
	Consumer string
	Requests []*operator.Request
	Next     string
}

func (d *Dashboard) requests(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	before, err := int64Param(q, "before")
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	data := requestsData{Consumer: q.Get("consumer")}
	rs, err := d.ops.List(r.Context(), d.pool, &operator.ListOpts{Consumer: data.Consumer, BeforeID: before, Limit: d.cfg.PageSize + 1})
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if len(rs) > d.cfg.PageSize {
		rs = rs[:d.cfg.PageSize]
		data.Next = d.cfg.Prefix + "/requests?" + url.Values{"consumer": {data.Consumer}, "before": {itoa(rs[len(rs)-1].ID)}}.Encode()
	}
	data.Requests = rs
	d.render(w, r, "requests", "Operator requests", &data)
}

// requestData is one request's page data: the request and its audit rows.
type requestData struct {
	Request *operator.Request
	Audit   []operator.Entry
}

func (d *Dashboard) request(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, errors.New("dashboard: request id "+strconv.Quote(r.PathValue("id"))+" is not a number"))
		return
	}
	req, err := d.ops.Get(r.Context(), d.pool, id)
	if errors.Is(err, outbox.ErrNotFound) {
		d.fail(w, r, http.StatusNotFound, err)
		return
	}
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	es, err := d.ops.Audit(r.Context(), d.pool, &operator.AuditOpts{RequestID: id, Limit: d.cfg.PageSize})
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d.renderView(w, r, http.StatusOK, "request", &view{Title: "Request " + itoa(id), Refresh: !req.Finished(),
		D: &requestData{Request: req, Audit: es}})
}

// auditData is the audit log page's data.
type auditData struct {
	Consumer string
	Entries  []operator.Entry
	Next     string
}

func (d *Dashboard) audit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	before, err := int64Param(q, "before")
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, err)
		return
	}
	data := auditData{Consumer: q.Get("consumer")}
	es, err := d.ops.Audit(r.Context(), d.pool, &operator.AuditOpts{Consumer: data.Consumer, BeforeID: before, Limit: d.cfg.PageSize + 1})
	if err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if len(es) > d.cfg.PageSize {
		es = es[:d.cfg.PageSize]
		data.Next = d.cfg.Prefix + "/audit?" + url.Values{"consumer": {data.Consumer}, "before": {itoa(es[len(es)-1].ID)}}.Encode()
	}
	data.Entries = es
	d.render(w, r, "audit", "Audit log", &data)
}

// cancelRequest cancels a pending or running request (the form on its
// page) and shows the request's page again.
func (d *Dashboard) cancelRequest(w http.ResponseWriter, r *http.Request) {
	actor, ok := d.authorizePost(w, r)
	if !ok {
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		d.fail(w, r, http.StatusBadRequest, errors.New("dashboard: request id "+strconv.Quote(r.PathValue("id"))+" is not a number"))
		return
	}
	if err := d.allow(r, actor, Act{Action: CancelAction, RequestID: id}); err != nil {
		d.fail(w, r, http.StatusForbidden, fmt.Errorf("dashboard: %s may not cancel request %d: %w", actor, id, err))
		return
	}
	_, err = d.ops.Cancel(operator.WithActor(r.Context(), actor), d.pool, id)
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		d.fail(w, r, http.StatusNotFound, err)
		return
	case errors.Is(err, operator.ErrFinished):
		d.fail(w, r, http.StatusConflict, err)
		return
	case err != nil:
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d.log.InfoContext(r.Context(), "dashboard: operator request cancelled", slog.Int64("request_id", id), slog.String("actor", actor))
	http.Redirect(w, r, d.cfg.Prefix+"/requests/"+itoa(id), http.StatusSeeOther)
}
