package dashboard

import (
	"bytes"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/d419a114/outbox/deadletter"
)

//go:embed templates/*.html
var templateFS embed.FS

// staticFS holds static/, served at /static/.
//
//go:embed static
var staticFS embed.FS

// pages are the parsed templates, one set per page, each with the layout.
type pages map[string]*template.Template

var pageNames = []string{"fleet", "overview", "deadevents", "letters", "letter", "gaps", "confirm", "requests", "request", "audit", "error", "search"}

var funcs = template.FuncMap{
	"age":   age,
	"since": func(t time.Time) string { return age(time.Since(t)) },
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"seg":  url.PathEscape,
	"list": func(s ...string) []string { return s },
	// reasons are the dead letters' reasons, for a filter to offer.
	"reasons": deadletter.Reasons,
}

func parsePages() (pages, error) {
	ps := pages{}
	for _, n := range pageNames {
		t, err := template.New(n).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+n+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: parse template %s: %w", n, err)
		}
		ps[n] = t
	}
	return ps, nil
}

// view is what every page's template gets: the layout's fields and the
// page's own data in D.
type view struct {
	Base, Schema, Title string
	// Fleet is the fleet overview's path when the page belongs to a
	// [Fleet]; Shard names the shard the page is of ("" on the overview).
	Fleet, Shard string
	// CanAct says whether to offer actions; Actor is who would act, CSRF
	// the token forms carry.
	CanAct      bool
	Actor, CSRF string
	// Refresh reloads the page every second (a request still running).
	Refresh bool
	D       any
}

// render writes page name with data d; errors while writing go to the
// log, the client having gone.
func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	d.renderView(w, r, http.StatusOK, name, &view{Title: title, D: data})
}

func (d *Dashboard) renderView(w http.ResponseWriter, r *http.Request, status int, name string, v *view) {
	v.Base, v.Schema = d.cfg.Prefix, d.cfg.Schema
	if d.fleet != nil {
		v.Fleet, v.Shard = d.fleet.base+"/", d.fleet.shard
	}
	v.Actor, v.CanAct = d.actor(r)
	v.CSRF = d.token(w, r)
	writePage(w, r, d.log, d.pages, name, v, status)
}

// writePage renders page name of ps with v and sends it with status. A
// page that fails to render is logged and answered with 500; an error
// while writing goes to log at DEBUG, the client having gone.
func writePage(w http.ResponseWriter, r *http.Request, log *slog.Logger, ps pages, name string, v *view, status int) {
	var buf bytes.Buffer
	if err := ps[name].ExecuteTemplate(&buf, "layout", v); err != nil {
		log.ErrorContext(r.Context(), "dashboard: render page failed", slog.String("page", name), slog.String("error", err.Error()))
		http.Error(w, "dashboard: render page "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if _, err := w.Write(buf.Bytes()); err != nil {
		log.DebugContext(r.Context(), "dashboard: write page failed", slog.String("page", name), slog.String("error", err.Error()))
	}
}

// logged logs err, a database's error that a part of a page could not be
// read for, under an id, and returns what the page shows in its place.
func (d *Dashboard) logged(r *http.Request, err error) string {
	id := errorID()
	d.log.ErrorContext(r.Context(), "dashboard: part of a page failed", slog.String("error_id", id), slog.String("path", r.URL.Path), slog.String("error", err.Error()))
	return "could not be read; the service's log has the error under error_id=" + id
}

// fail shows err on the error page with status. A server error's text can
// name the database's user, host and port, so the page shows only an id
// and the log has the error under it; a client error's text is the
// dashboard's own and says what to fix.
func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	msg := err.Error()
	if status >= 500 {
		id := errorID()
		d.log.ErrorContext(r.Context(), "dashboard: page failed", slog.String("error_id", id), slog.String("path", r.URL.Path), slog.String("error", msg))
		msg = "dashboard: the page failed; the service's log has the error under error_id=" + id
	}
	d.renderView(w, r, status, "error", &view{Title: http.StatusText(status), D: msg})
}

// errorID names one logged error for the page that shows it.
func errorID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// age prints a duration short: "3d", "2h5m0s", "4s"; "-" for none.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d >= 48*time.Hour:
		return strconv.Itoa(int(d.Hours()/24)) + "d"
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= time.Second:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}

// capped prints a count read with a bound of limit+1: "10000+" when it
// reached past limit.
func capped(n int64, limit int) string {
	if n > int64(limit) {
		return strconv.Itoa(limit) + "+"
	}
	return strconv.FormatInt(n, 10)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
