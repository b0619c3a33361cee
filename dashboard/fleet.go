package dashboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

// FleetShard is one shard of a [Fleet] dashboard.
type FleetShard struct {
	// Name labels the shard ([shard.CheckName]) and is its path: its own
	// dashboard is at Prefix/shards/Name/.
	Name string
	// Pool reaches the shard's database.
	Pool *pgxpool.Pool
	// Schema holds the shard's outbox tables. Default outbox.DefaultSchema.
	Schema string
}

// Fleet is the dashboard of many shards: an overview with one row per
// shard (backlog, oldest undelivered event, dead events, live relays) at
// Prefix/, and each shard's own [Dashboard] at Prefix/shards/NAME/, where
// its pages and actions work as on a dashboard of that shard alone. It is
// safe for concurrent use.
//
// The overview reads each shard with two bounded queries (the producer's
// health and its relay instances), at most fleetReaders shards at once and
// each within fleetReadTimeout; a shard that does not answer in time
// shows why in its row and holds up no other. Views share one read every
// [Config.HealthEvery] (at most every fleetMinEvery), so a page reloaded
// by many people costs the shards one read a period.
type Fleet struct {
	cfg    Config
	shards []*fleetEntry
	byName map[string]*fleetEntry
	pages  pages
	mux    *http.ServeMux
	log    *slog.Logger
	sample fleetSample
}

// fleetEntry is one shard of a Fleet.
type fleetEntry struct {
	name string
	dash *Dashboard
}

// fleetSample is the overview's rows as last read.
type fleetSample struct {
	mu   sync.Mutex
	at   time.Time
	rows []fleetRow
}

// fleetRow is one shard's row of the fleet overview.
type fleetRow struct {
	Name, Schema string
	// Err says why the shard could not be read; the rest is then zero.
	Err    string
	Health producer.Health
	// Live and Relays count its live relay instances and all of them.
	Live, Relays int
	// NoRelay is set when events wait and no relay instance is live.
	NoRelay bool
}

// fleetData is the fleet overview page's data.
type fleetData struct {
	Rows []fleetRow
	// Total sums the rows that could be read: undelivered, dead, and the
	// oldest undelivered of all.
	Total producer.Health
	// Failed counts the shards that could not be read.
	Failed      int
	SampledAt   time.Time
	HealthEvery time.Duration
}

const (
	// fleetReaders bounds the shards the overview reads at once.
	fleetReaders = 8
	// fleetReadTimeout bounds one shard's read.
	fleetReadTimeout = 5 * time.Second
	// fleetMinEvery is the shortest period between two reads of the
	// shards, whatever HealthEvery says.
	fleetMinEvery = 2 * time.Second
)

// NewFleet returns the dashboard of shards, configured by cfg (nil means
// the defaults) as [New] is, except that each shard names its own schema
// ([Config.Schema] is not used). Each shard's own dashboard is mounted at
// Prefix/shards/NAME/ and logs with a "shard" attribute.
func NewFleet(shards []FleetShard, cfg *Config) (*Fleet, error) {
	if len(shards) == 0 {
		return nil, errors.New("dashboard: NewFleet needs at least one shard")
	}
	c, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	ps, err := parsePages()
	if err != nil {
		return nil, err
	}
	f := &Fleet{cfg: c, byName: map[string]*fleetEntry{}, pages: ps, log: c.Logger}
	for i, s := range shards {
		if err := shard.CheckName(s.Name); err != nil {
			return nil, fmt.Errorf("dashboard: shards[%d]: %w", i, err)
		}
		if s.Pool == nil {
			return nil, fmt.Errorf("dashboard: shard %s: nil pool; pass a pool of its database", s.Name)
		}
		if _, dup := f.byName[s.Name]; dup {
			return nil, fmt.Errorf("dashboard: shard %s is listed twice; give each shard a name of its own", s.Name)
		}
		sc := c
		sc.Schema = s.Schema
		if sc.Schema == "" {
			sc.Schema = outbox.DefaultSchema
		}
		sc.Prefix = c.Prefix + "/shards/" + s.Name
		sc.Logger = c.Logger.With(slog.String("shard", s.Name))
		d, err := build(s.Pool, sc, ps)
		if err != nil {
			return nil, fmt.Errorf("dashboard: shard %s: %w", s.Name, err)
		}
		d.fleet = &fleetLink{base: c.Prefix, shard: s.Name}
		e := &fleetEntry{name: s.Name, dash: d}
		f.shards = append(f.shards, e)
		f.byName[s.Name] = e
	}
	f.mux = http.NewServeMux()
	f.mux.Handle("GET /static/", f.shards[0].dash.mux)
	f.mux.HandleFunc("GET /{$}", f.overview)
	f.mux.HandleFunc("/shards/{shard}/", f.toShard)
	return f, nil
}

// fleetLink places a shard's dashboard in its fleet, for the layout's
// way back.
type fleetLink struct {
	base, shard string
}

// ServeHTTP serves the fleet overview and the shards' dashboards under
// [Config.Prefix], with the same refusals and headers as [Dashboard].
func (f *Fleet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	serve(&f.cfg, f.mux, w, r)
}

// toShard hands a request to its shard's dashboard, which sees its own
// paths (the fleet's and the shard's prefixes stripped).
func (f *Fleet) toShard(w http.ResponseWriter, r *http.Request) {
	e, ok := f.byName[r.PathValue("shard")]
	if !ok {
		f.renderError(w, r, http.StatusNotFound, "dashboard: no shard is named "+r.PathValue("shard")+" in this fleet")
		return
	}
	http.StripPrefix("/shards/"+e.name, e.dash.mux).ServeHTTP(w, r)
}

func (f *Fleet) overview(w http.ResponseWriter, r *http.Request) {
	s := &f.sample
	s.mu.Lock()
	every := max(f.cfg.HealthEvery, fleetMinEvery)
	if s.at.IsZero() || time.Since(s.at) >= every {
		s.rows, s.at = f.read(r.Context()), time.Now()
	}
	data := fleetData{Rows: slices.Clone(s.rows), SampledAt: s.at, HealthEvery: every}
	s.mu.Unlock()
	for _, row := range data.Rows {
		if row.Err != "" {
			data.Failed++
			continue
		}
		data.Total.Undelivered += row.Health.Undelivered
		data.Total.Dead += row.Health.Dead
		data.Total.OldestUndelivered = max(data.Total.OldestUndelivered, row.Health.OldestUndelivered)
	}
	f.render(w, r, http.StatusOK, "fleet", &view{Title: "Fleet", D: &data})
}

// read reads every shard's row, fleetReaders at a time.
func (f *Fleet) read(ctx context.Context) []fleetRow {
	rows := make([]fleetRow, len(f.shards))
	sem := make(chan struct{}, fleetReaders)
	var wg sync.WaitGroup
	for i, e := range f.shards {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			rows[i] = f.readShard(ctx, e)
		}()
	}
	wg.Wait()
	return rows
}

// readShard reads one shard's row; an error is logged under an id and
// the row says so.
func (f *Fleet) readShard(ctx context.Context, e *fleetEntry) fleetRow {
	ctx, cancel := context.WithTimeout(ctx, fleetReadTimeout)
	defer cancel()
	row := fleetRow{Name: e.name, Schema: e.dash.cfg.Schema}
	h, err := e.dash.prod.Health(ctx)
	var relays []producer.RelayInstance
	if err == nil {
		relays, err = e.dash.prod.Relays(ctx)
	}
	if err != nil {
		id := errorID()
		f.log.ErrorContext(ctx, "dashboard: read shard failed", slog.String("shard", e.name), slog.String("error_id", id), slog.String("error", err.Error()))
		row.Err = "could not be read; the service's log has the error under error_id=" + id
		return row
	}
	row.Health, row.Relays = h, len(relays)
	for _, ri := range relays {
		if ri.Live {
			row.Live++
		}
	}
	row.NoRelay = h.Undelivered > 0 && row.Live == 0 && h.Dispatch != producer.DispatchCDC
	return row
}

// renderError shows msg, the fleet's own client error, on the error page.
func (f *Fleet) renderError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	f.render(w, r, status, "error", &view{Title: http.StatusText(status), D: msg})
}

// render writes page name of the fleet with v.
func (f *Fleet) render(w http.ResponseWriter, r *http.Request, status int, name string, v *view) {
	v.Base, v.Fleet = f.cfg.Prefix, f.cfg.Prefix+"/"
	v.Actor, v.CanAct = f.shards[0].dash.actor(r)
	writePage(w, r, f.log, f.pages, name, v, status)
}
