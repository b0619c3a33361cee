package producer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/backoff"
	"github.com/d419a114/outbox/internal/pgsession"
	"github.com/d419a114/outbox/shard"
)

// FleetConfig tunes a Fleet. The zero value is valid.
type FleetConfig struct {
	// Relay holds the settings every shard's relay uses, with the defaults
	// of NewRelay. Schema and SessionConfig must be left empty: each shard
	// names its schema and database. The Logger's records carry the
	// shard's name as the attribute "shard". RelayID, when empty, is one
	// id for the whole fleet (host name, process id, random suffix); each
	// schema's relays table has a row for it.
	Relay RelayConfig
	// MaxConnsPerServer bounds the connections the fleet opens to one
	// server, that is to the shards with the same shard.Shard.Server():
	// a pool of MaxConnsPerServer-2 for claims, marks, leases and pruning,
	// one session for every shard's bucket locks, and one for LISTEN on
	// every shard's channel. At least 3. Default 10.
	MaxConnsPerServer int
	// ApplicationName is the application_name of the fleet's connections,
	// as pg_stat_activity shows them. Default "outbox-relay-fleet".
	ApplicationName string
}

// Fleet runs a relay for each of many shards from one process, with a
// bounded number of connections per server: the shards of one server
// share a pool, one session for their bucket locks, and one LISTEN
// session. Each shard behaves as a Relay over its schema does, and shares
// its buckets with the other Fleets and Relays over that schema in the
// same way, so per-aggregate order holds across them all.
//
// The shards of a server claim at the same time, each on a connection of
// the pool, and each shard's batch waits only for its own records: a shard
// draining a backlog does not make a quiet one wait for its claims.
// Shards can be changed while the fleet runs (Set).
type Fleet struct {
	client *kgo.Client
	cfg    FleetConfig
	log    *slog.Logger

	// setMu serialises Set and the start and end of Run.
	setMu sync.Mutex
	// mu guards shards, servers and runCtx.
	mu      sync.Mutex
	shards  map[string]*fleetShard
	servers map[string]*fleetServer
	// runCtx is Run's context while it runs; nil before.
	runCtx context.Context
	// ran is set when Run starts, ended when it returned.
	ran, ended bool
}

// fleetShard is one shard's relay; the fleet's Set and Run start and stop
// it.
type fleetShard struct {
	shard  shard.Shard
	relay  *Relay
	server *fleetServer
	// cancel and done are set while its relay runs.
	cancel context.CancelFunc
	done   chan struct{}
}

// ended reports whether the shard's relay ran and returned by itself.
func (fs *fleetShard) ended() bool {
	if fs.done == nil {
		return false
	}
	select {
	case <-fs.done:
		return true
	default:
		return false
	}
}

// fleetServer is what the shards of one server share. users counts the
// shards using it (guarded by Fleet.mu); the last to leave closes it.
type fleetServer struct {
	pool     *pgxpool.Pool
	session  *lockSession
	listener *sharedListener
	users    int
	// stopListener and listenerDone are set while the listener runs.
	stopListener context.CancelFunc
	listenerDone chan struct{}
}

// NewFleet validates shards and cfg (nil means defaults) and returns a
// Fleet that publishes the shards' events through client, with the same
// requirements on the client as NewRelay. Nothing connects before Run.
func NewFleet(client *kgo.Client, shards []shard.Shard, cfg *FleetConfig) (*Fleet, error) {
	if client == nil {
		return nil, errors.New("producer: NewFleet needs a kgo.Client; got nil")
	}
	c := FleetConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Relay.Schema != "" || c.Relay.SessionConfig != nil {
		return nil, errors.New("producer: FleetConfig.Relay.Schema and SessionConfig must be empty: each shard.Shard gives its schema and database")
	}
	setDefault(&c.MaxConnsPerServer, 10)
	if c.MaxConnsPerServer < 3 {
		return nil, fmt.Errorf("producer: FleetConfig.MaxConnsPerServer is %d; a fleet needs at least 3 per server (a pool connection, a lock session and a LISTEN session)", c.MaxConnsPerServer)
	}
	setDefault(&c.ApplicationName, "outbox-relay-fleet")
	if c.Relay.Logger == nil {
		c.Relay.Logger = slog.Default()
	}
	if c.Relay.RelayID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.Relay.RelayID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	f := &Fleet{client: client, cfg: c, log: c.Relay.Logger, shards: map[string]*fleetShard{}, servers: map[string]*fleetServer{}}
	if err := f.Set(shards); err != nil {
		f.closeServers()
		return nil, err
	}
	return f, nil
}

// Set makes shards the fleet's shards. A shard whose name is new starts
// (at once while Run runs); one whose name is gone stops as a Relay whose
// Run ends does: its batch in flight is published and marked, and its
// buckets are released for the other relays of its schema; one whose
// database or schema changed does both, as does one whose relay stopped
// on an error (see Run). Other shards are not touched. Set validates the whole list first and changes nothing if it
// is invalid; a shard that fails to start (NewRelay's checks) is left out
// and named in the error, the others start. It is safe to call from any
// goroutine, before or during Run; after Run returned it returns
// ErrFleetStopped.
func (f *Fleet) Set(shards []shard.Shard) error {
	want := make(map[string]shard.Shard, len(shards))
	for _, s := range shards {
		if err := s.Validate(); err != nil {
			return fmt.Errorf("producer: %w", err)
		}
		if _, dup := want[s.Name]; dup {
			return fmt.Errorf("producer: shard %s is listed twice; shard names must be unique", s.Name)
		}
		if _, err := s.Server(); err != nil {
			return fmt.Errorf("producer: %w", err)
		}
		want[s.Name] = s
	}
	f.setMu.Lock()
	defer f.setMu.Unlock()
	if f.ended {
		return ErrFleetStopped
	}
	var stop []*fleetShard
	f.mu.Lock()
	for name, fs := range f.shards {
		if w, ok := want[name]; !ok || w != fs.shard || fs.ended() {
			stop = append(stop, fs)
			delete(f.shards, name)
		}
	}
	f.mu.Unlock()
	f.stop(stop)
	var errs []error
	for name, s := range want {
		f.mu.Lock()
		_, have := f.shards[name]
		f.mu.Unlock()
		if have {
			continue
		}
		if err := f.add(s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// add builds the relay of s and starts it if Run runs. The caller holds
// setMu.
func (f *Fleet) add(s shard.Shard) error {
	key, _ := s.Server() // checked by Set
	f.mu.Lock()
	defer f.mu.Unlock()
	srv, ok := f.servers[key]
	if !ok {
		var err error
		if srv, err = f.newServer(s); err != nil {
			return err
		}
		f.servers[key] = srv
	}
	c := f.cfg.Relay
	c.Schema = s.Schema
	c.SessionConfig = srv.session.cfg
	c.Logger = f.cfg.Relay.Logger.With(slog.String("shard", s.Name))
	relay, err := NewRelay(srv.pool, f.client, &c)
	if err != nil {
		if srv.users == 0 {
			delete(f.servers, key)
			srv.pool.Close()
		}
		return err
	}
	relay.shared = srv
	srv.users++
	fs := &fleetShard{shard: s, relay: relay, server: srv}
	f.shards[s.Name] = fs
	if f.runCtx != nil {
		f.start(fs)
	}
	return nil
}

// newServer makes what the shards of s's server share; nothing connects
// yet. The caller holds mu.
func (f *Fleet) newServer(s shard.Shard) (*fleetServer, error) {
	poolCfg, err := pgxpool.ParseConfig(s.Database)
	if err != nil {
		return nil, fmt.Errorf("producer: shard %s: database is not a valid pgx connection string", s.Name)
	}
	poolCfg.ConnConfig.RuntimeParams["application_name"] = f.cfg.ApplicationName
	poolCfg.MaxConns = int32(f.cfg.MaxConnsPerServer - 2) //nolint:gosec // a connection count
	poolCfg.MinConns = 0
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	if err != nil {
		return nil, fmt.Errorf("producer: shard %s: make the pool: %w", s.Name, err)
	}
	sessCfg := poolCfg.ConnConfig.Copy()
	check := func(ctx context.Context, conn *pgx.Conn) error {
		err := pgsession.Check(ctx, conn)
		if errors.Is(err, outbox.ErrNotSession) {
			return fmt.Errorf("producer: the database of shard %s (%s:%d) must give the fleet a session of its own for its bucket locks and LISTEN; point it at the PostgreSQL server directly or at a session-mode pool (PgBouncer pool_mode=session): %w",
				s.Name, sessCfg.Host, sessCfg.Port, err)
		}
		if err != nil {
			return fmt.Errorf("producer: check that shard %s's database gives a session of its own: %w", s.Name, err)
		}
		return nil
	}
	retry := backoff.Policy{Min: f.cfg.Relay.MinBackoff, Max: f.cfg.Relay.MaxBackoff}
	setDefault(&retry.Min, 100*time.Millisecond)
	setDefault(&retry.Max, time.Minute)
	return &fleetServer{
		pool:     pool,
		session:  newLockSession(sessCfg, check, "", true),
		listener: newSharedListener(sessCfg, f.log.With(slog.String("server", fmt.Sprintf("%s:%d/%s", sessCfg.Host, sessCfg.Port, sessCfg.Database))), retry),
	}, nil
}

// start runs fs's relay, and its server's listener if it does not run
// yet. The caller holds mu, and runCtx is set.
func (f *Fleet) start(fs *fleetShard) {
	srv := fs.server
	if srv.listenerDone == nil {
		ctx, cancel := context.WithCancel(f.runCtx)
		srv.stopListener, srv.listenerDone = cancel, make(chan struct{})
		go func() {
			defer close(srv.listenerDone)
			srv.listener.run(ctx)
		}()
	}
	ctx, cancel := context.WithCancel(f.runCtx)
	fs.cancel, fs.done = cancel, make(chan struct{})
	go func() {
		defer close(fs.done)
		if err := fs.relay.Run(ctx); err != nil {
			fs.relay.log.ErrorContext(ctx, "relay fleet: shard stopped; Fleet.Set restarts it once fixed", slog.String("error", err.Error()))
		}
	}()
}

// stop ends the relays of shards, all at once, waits for them, and closes
// the servers no shard uses any more.
func (f *Fleet) stop(shards []*fleetShard) {
	for _, fs := range shards {
		if fs.cancel != nil {
			fs.cancel()
		}
	}
	for _, fs := range shards {
		if fs.done != nil {
			<-fs.done
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fs := range shards {
		fs.server.users--
	}
	f.closeServersLocked(false)
}

// closeServersLocked closes the servers without users (all, with all).
// The caller holds mu.
func (f *Fleet) closeServersLocked(all bool) {
	for key, srv := range f.servers {
		if srv.users > 0 && !all {
			continue
		}
		if srv.listenerDone != nil {
			srv.stopListener()
			<-srv.listenerDone
		}
		srv.session.close()
		srv.pool.Close()
		delete(f.servers, key)
	}
}

func (f *Fleet) closeServers() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closeServersLocked(true)
}

// Run publishes every shard's events until ctx ends, then stops each shard
// as Relay.Run does (batch in flight published and marked, buckets
// released), closes the fleet's connections and returns nil. Database and
// broker errors are logged with the shard's name and retried; a shard
// whose Relay.Run would return an error (its schema went to CDC mode, or
// its database gives no session of its own) is logged at ERROR and stops
// alone, until Set lists it again. Run it once per Fleet.
func (f *Fleet) Run(ctx context.Context) error {
	f.setMu.Lock()
	if f.ran {
		f.setMu.Unlock()
		return errors.New("producer: Fleet.Run called twice; make a new Fleet")
	}
	f.ran = true
	f.mu.Lock()
	f.runCtx = ctx
	for _, fs := range f.shards {
		f.start(fs)
	}
	f.mu.Unlock()
	f.setMu.Unlock()

	<-ctx.Done()

	f.setMu.Lock()
	defer f.setMu.Unlock()
	f.mu.Lock()
	all := make([]*fleetShard, 0, len(f.shards))
	for _, fs := range f.shards {
		all = append(all, fs)
	}
	clear(f.shards)
	f.mu.Unlock()
	f.stop(all)
	f.closeServers()
	f.ended = true
	return nil
}

// ErrFleetStopped is Set's error once the fleet's Run returned.
var ErrFleetStopped = errors.New("producer: the fleet's Run has returned; make a new Fleet")

// Health returns each shard's RelayHealth by shard name. It is safe to
// call from any goroutine and does not touch the database.
func (f *Fleet) Health() map[string]RelayHealth {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]RelayHealth, len(f.shards))
	for name, fs := range f.shards {
		out[name] = fs.relay.Health()
	}
	return out
}
