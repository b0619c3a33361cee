package dashboard

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/dedupe"
	"github.com/d419a114/outbox/internal/tables"
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
	// Allow, when set, decides per action whether the actor Authorize
	// named may carry it out: a replay of one letter, a bulk discard of
	// a filter, a resolve-gap, a producer dead event's replay (see Act).
	// It is asked when the confirmation is shown (a refused action is not
	// offered, and the page says why) and again on the POST, which it
	// refuses with 403 and its error. Default nil: whoever Authorize
	// allows may do everything.
	Allow func(r *http.Request, actor string, act Act) error
	// AllowRemote lets clients connect from addresses other than loopback
	// ones. Behind a reverse proxy every client looks like the proxy:
	// protect the route there, and set Authorize. New warns when it is set
	// without Authorize: every client that reaches it reads every payload.
	// Default false.
	AllowRemote bool
	// Hosts are the names, besides loopback ones (localhost, *.localhost,
	// 127.0.0.1, [::1]), that requests may carry in their Host header, such
	// as "ops.example.com" or "ops.example.com:8443". A request for any
	// other host is refused with 421, so that a web page the operator
	// visits cannot rebind its own name to the dashboard's address and
	// read it (DNS rebinding), and a same-host proxy that forwards a
	// public name is noticed. "*" allows any host. Required with
	// AllowRemote. Default none: loopback names only.
	Hosts []string
	// HealthEvery is how often the overview reads the consumers' health
	// (consumer.Inspector.Health and their gaps, which count over their
	// tables); views in between show the last sample and its age, so a
	// page reloaded by many people costs one read a period. Default 1m;
	// negative reads on every view.
	HealthEvery time.Duration
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
	// Kafka, when set, is a client of the consumers' cluster: the overview
	// then shows each consumer's lag per partition, read from the broker
	// (with the consumers' health, every HealthEvery) for the group its
	// members report. Default nil: no lag.
	Kafka *kgo.Client
	// Logger receives the actions taken and the errors pages met. Default
	// slog.Default().
	Logger *slog.Logger
}

// Dashboard is the dashboard's http.Handler. It is safe for concurrent
// use.
type Dashboard struct {
	cfg    Config
	pool   *pgxpool.Pool
	mux    *http.ServeMux
	pages  pages
	cons   *consumer.Inspector
	ops    *operator.Store
	prod   *producer.Inspector
	dead   *producer.DeadEvents
	origin *http.CrossOriginProtection
	log    *slog.Logger
	// sample holds the overview's consumer rows; see [Config.HealthEvery].
	sample consumerSample
	// submitted holds the forms posted lately; see submitOnce.
	submitted submitted
	// fleet places the dashboard in a [Fleet]; nil for one on its own.
	fleet *fleetLink
}

// New returns the dashboard of cfg's schema (nil means the defaults) on
// pool, which must reach the consumers' and the producer's tables; the
// tables of a side that is not in this database show as errors on their
// pages, the rest works.
func New(pool *pgxpool.Pool, cfg *Config) (*Dashboard, error) {
	if pool == nil {
		return nil, errors.New("dashboard: nil pool; pass the pool of the database that holds the outbox tables")
	}
	c, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	ps, err := parsePages()
	if err != nil {
		return nil, err
	}
	return build(pool, c, ps)
}

// configure validates cfg (nil means the defaults) and returns it with
// the defaults filled in.
func configure(cfg *Config) (Config, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = outbox.DefaultSchema
	}
	if err := tables.CheckSchema(c.Schema); err != nil {
		return Config{}, fmt.Errorf("dashboard: %w", err)
	}
	if c.AllowRemote && len(c.Hosts) == 0 {
		return Config{}, errors.New("dashboard: AllowRemote needs Config.Hosts, the names clients reach the dashboard by (the Host header), so that DNS rebinding cannot reach it; \"*\" allows any")
	}
	for _, h := range c.Hosts {
		if h == "" || strings.ContainsAny(h, "/ ") {
			return Config{}, fmt.Errorf("dashboard: Hosts entry %q is not a host name or host:port", h)
		}
	}
	if c.HealthEvery == 0 {
		c.HealthEvery = time.Minute
	}
	if c.Prefix != "" && (!strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/")) {
		return Config{}, fmt.Errorf("dashboard: Prefix %q must start with a slash and not end with one, like \"/outbox\"", c.Prefix)
	}
	switch {
	case c.PageSize < 0 || c.PageSize > 500:
		return Config{}, fmt.Errorf("dashboard: PageSize %d is out of range; want 1 to 500, or 0 for 50", c.PageSize)
	case c.PageSize == 0:
		c.PageSize = 50
	}
	switch {
	case c.CountCap < 0:
		return Config{}, fmt.Errorf("dashboard: negative CountCap %d; want 0 for 10000, or a positive bound", c.CountCap)
	case c.CountCap == 0:
		c.CountCap = 10000
	}
	switch {
	case c.KeyRetention < 0:
		return Config{}, fmt.Errorf("dashboard: negative KeyRetention %s; give the consumers' consumer.Config.KeyRetention", c.KeyRetention)
	case c.KeyRetention == 0:
		c.KeyRetention = dedupe.DefaultRetention
	}
	if c.CSRFKey == nil {
		c.CSRFKey = make([]byte, 32)
		_, _ = rand.Read(c.CSRFKey) // crypto/rand.Read never fails
	} else if len(c.CSRFKey) < 32 {
		return Config{}, fmt.Errorf("dashboard: CSRFKey has %d bytes; give at least 32 random bytes, or none for a key per process", len(c.CSRFKey))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.AllowRemote && c.Authorize == nil {
		c.Logger.Warn("dashboard: AllowRemote is set and Authorize is not: every client that reaches the dashboard reads every record's payload; put it behind an authenticating proxy, or serve loopback clients only",
			slog.String("schema", c.Schema), slog.Any("hosts", c.Hosts))
	}
	return c, nil
}

// build returns the dashboard of c, a configured Config, on pool.
func build(pool *pgxpool.Pool, c Config, ps pages) (*Dashboard, error) {
	prod, err := producer.NewInspector(pool, c.Schema)
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	cons, err := consumer.NewInspector(pool, c.Schema)
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	dead, err := producer.NewDeadEvents(&producer.DeadEventsConfig{Schema: c.Schema})
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	d := &Dashboard{
		cfg: c, pool: pool, pages: ps, log: c.Logger,
		cons:   cons,
		ops:    operator.New(&operator.Config{Schema: c.Schema}),
		prod:   prod,
		dead:   dead,
		origin: http.NewCrossOriginProtection(),
	}
	d.mux = d.routes()
	return d, nil
}

// routes maps the dashboard's paths, relative to Prefix, to their pages.
func (d *Dashboard) routes() *http.ServeMux {
	m := http.NewServeMux()
	static := http.FileServerFS(staticFS)
	m.HandleFunc("GET /static/", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no listing of the files
			return
		}
		static.ServeHTTP(w, r)
	})
	m.HandleFunc("GET /{$}", d.overview)
	m.HandleFunc("GET /producer/dead", d.deadEvents)
	m.HandleFunc("GET /producer/dead/{id}/confirm", d.confirmDeadEvent)
	m.HandleFunc("POST /producer/dead/{id}", d.actOnDeadEvent)
	m.HandleFunc("GET /consumers/{consumer}/letters", d.letterList)
	m.HandleFunc("GET /consumers/{consumer}/letters/{id}", d.letter)
	m.HandleFunc("GET /consumers/{consumer}/gaps", d.gaps)
	m.HandleFunc("GET /consumers/{consumer}/search", d.search)
	m.HandleFunc("GET /consumers/{consumer}/confirm", d.confirm)
	m.HandleFunc("POST /consumers/{consumer}/requests", d.submit)
	m.HandleFunc("GET /requests", d.requests)
	m.HandleFunc("GET /requests/{id}", d.request)
	m.HandleFunc("POST /requests/{id}/cancel", d.cancelRequest)
	m.HandleFunc("GET /audit", d.audit)
	return m
}

// ServeHTTP serves the dashboard's pages under [Config.Prefix]. Every
// response, refusals and static files included, carries headers that keep
// it out of frames, scripts and other sites' referrers.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serve(&d.cfg, d.mux, w, r)
}

// serve hands r, once admitted, to mux with cfg's Prefix stripped.
func serve(cfg *Config, mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	if !admit(cfg, w, r) {
		return
	}
	if cfg.Prefix != "" {
		http.StripPrefix(cfg.Prefix, mux).ServeHTTP(w, r)
		return
	}
	mux.ServeHTTP(w, r)
}

// admit sets the headers every response carries and refuses, with the
// reason, a request for a host cfg does not serve or from a client it
// does not serve; it reports whether r may go on.
func admit(cfg *Config, w http.ResponseWriter, r *http.Request) bool {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'none'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	if !hostAllowed(cfg.Hosts, r.Host) {
		http.Error(w, "dashboard: host "+strconv.Quote(r.Host)+" is not served; add it to Config.Hosts", http.StatusMisdirectedRequest)
		return false
	}
	if !cfg.AllowRemote && !loopback(r.RemoteAddr) {
		http.Error(w, "dashboard: only loopback clients are served; set Config.AllowRemote to serve others", http.StatusForbidden)
		return false
	}
	return true
}

// hostAllowed reports whether host, a request's Host header, names the
// dashboard: a loopback name, or one of hosts ([Config.Hosts]).
func hostAllowed(hosts []string, host string) bool {
	name, _, err := net.SplitHostPort(host)
	if err != nil {
		name = host
	}
	name = strings.TrimSuffix(strings.ToLower(strings.Trim(name, "[]")), ".")
	for _, h := range hosts {
		if h == "*" || strings.EqualFold(h, host) || strings.EqualFold(h, name) {
			return true
		}
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
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
