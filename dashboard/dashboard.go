package dashboard

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/dedupe"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/producer"
)

// Config tunes a Dashboard. The zero value is valid: read-only, for
// loopback clients, on schema outbox.DefaultSchema, mounted at the root.
type Config struct {
	// Schema holds the outbox tables. Default outbox.DefaultSchema.
	Schema string
	// Prefix is the path the handler is mounted at, such as "/outbox",
	// without a trailing slash; the handler strips it and starts its links
	// with it. Default "" (the root).
	Prefix string
	// Authorize decides whether r may act (replay, discard, resolve a
	// gap) and names who acts, for the audit log and the requests'
	// RequestedBy. It is asked on every page (to offer actions or not) and
	// on every POST. Default nil: read-only, every POST is refused with
	// 403.
	Authorize func(r *http.Request) (actor string, ok bool)
	// AllowRemote lets clients connect from addresses other than loopback
	// ones. Behind a reverse proxy every client looks like the proxy:
	// protect the route there. Default false.
	AllowRemote bool
	// CSRFKey signs the CSRF tokens. Give every replica behind one load
	// balancer the same key (at least 32 random bytes). Default a random
	// key per Dashboard, so tokens die with the process.
	CSRFKey []byte
	// PageSize is how many rows a listing shows a page. Default 50, at
	// most 500.
	PageSize int
	// CountCap bounds the counts that grow with the tables (matching
	// letters, gaps): beyond it the page shows "CountCap+". Default 10000.
	CountCap int
	// KeyRetention is the consumers' consumer.Config.KeyRetention, for the
	// overview's dedupe horizon warnings: an open letter or a parked
	// record older than it may apply its effect twice when replayed, and
	// processed keys older than it mean nobody prunes them. Default
	// dedupe.DefaultRetention.
	KeyRetention time.Duration
	// Logger receives the actions taken and the errors pages met. Default
	// slog.Default().
	Logger *slog.Logger
}

// Dashboard is the dashboard's http.Handler. It is safe for concurrent
// use.
type Dashboard struct {
	cfg     Config
	pool    *pgxpool.Pool
	mux     *http.ServeMux
	pages   pages
	letters *deadletter.Store
	ops     *operator.Store
	dead    *producer.DeadEvents
	origin  *http.CrossOriginProtection
	log     *slog.Logger
}

// New returns the dashboard of cfg's schema (nil means the defaults) on
// pool, which must reach the consumers' and the producer's tables; the
// tables of a side that is not in this database show as errors on their
// pages, the rest works.
func New(pool *pgxpool.Pool, cfg *Config) (*Dashboard, error) {
	if pool == nil {
		return nil, errors.New("dashboard: nil pool; pass the pool of the database that holds the outbox tables")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = outbox.DefaultSchema
	}
	if c.Prefix != "" && (!strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/")) {
		return nil, fmt.Errorf("dashboard: Prefix %q must start with a slash and not end with one, like \"/outbox\"", c.Prefix)
	}
	switch {
	case c.PageSize < 0 || c.PageSize > 500:
		return nil, fmt.Errorf("dashboard: PageSize %d is out of range; want 1 to 500, or 0 for 50", c.PageSize)
	case c.PageSize == 0:
		c.PageSize = 50
	}
	switch {
	case c.CountCap < 0:
		return nil, fmt.Errorf("dashboard: negative CountCap %d; want 0 for 10000, or a positive bound", c.CountCap)
	case c.CountCap == 0:
		c.CountCap = 10000
	}
	switch {
	case c.KeyRetention < 0:
		return nil, fmt.Errorf("dashboard: negative KeyRetention %s; give the consumers' consumer.Config.KeyRetention", c.KeyRetention)
	case c.KeyRetention == 0:
		c.KeyRetention = dedupe.DefaultRetention
	}
	if c.CSRFKey == nil {
		c.CSRFKey = make([]byte, 32)
		_, _ = rand.Read(c.CSRFKey) // crypto/rand.Read never fails
	} else if len(c.CSRFKey) < 32 {
		return nil, fmt.Errorf("dashboard: CSRFKey has %d bytes; give at least 32 random bytes, or none for a key per process", len(c.CSRFKey))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	ps, err := parsePages()
	if err != nil {
		return nil, err
	}
	d := &Dashboard{
		cfg: c, pool: pool, pages: ps, log: c.Logger,
		letters: deadletter.New(&deadletter.Config{Schema: c.Schema}),
		ops:     operator.New(&operator.Config{Schema: c.Schema}),
		dead:    producer.NewDeadEvents(&producer.DeadEventsConfig{Schema: c.Schema}),
		origin:  http.NewCrossOriginProtection(),
	}
	d.mux = d.routes()
	return d, nil
}

// routes maps the dashboard's paths, relative to Prefix, to their pages.
func (d *Dashboard) routes() *http.ServeMux {
	m := http.NewServeMux()
	m.Handle("GET /static/", http.FileServerFS(staticFS))
	m.HandleFunc("GET /{$}", d.overview)
	m.HandleFunc("GET /producer/dead", d.deadEvents)
	m.HandleFunc("GET /producer/dead/{id}/confirm", d.confirmDeadEvent)
	m.HandleFunc("POST /producer/dead/{id}", d.actOnDeadEvent)
	m.HandleFunc("GET /consumers/{consumer}/letters", d.letterList)
	m.HandleFunc("GET /consumers/{consumer}/letters/{id}", d.letter)
	m.HandleFunc("GET /consumers/{consumer}/gaps", d.gaps)
	m.HandleFunc("GET /consumers/{consumer}/confirm", d.confirm)
	m.HandleFunc("POST /consumers/{consumer}/requests", d.submit)
	m.HandleFunc("GET /requests", d.requests)
	m.HandleFunc("GET /requests/{id}", d.request)
	m.HandleFunc("POST /requests/{id}/cancel", d.cancelRequest)
	m.HandleFunc("GET /audit", d.audit)
	return m
}

// ServeHTTP serves the dashboard's pages under Config.Prefix.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !d.cfg.AllowRemote && !loopback(r.RemoteAddr) {
		http.Error(w, "dashboard: only loopback clients are served; set Config.AllowRemote to serve others", http.StatusForbidden)
		return
	}
	if d.cfg.Prefix != "" {
		http.StripPrefix(d.cfg.Prefix, d.mux).ServeHTTP(w, r)
		return
	}
	d.mux.ServeHTTP(w, r)
}

// loopback reports whether addr, a RemoteAddr, is a loopback address.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
