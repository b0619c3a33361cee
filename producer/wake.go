package producer

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// wakeQuietFor is how long writes to a database skip the question after a
// write found no relay idle, counted from when that write's statement was
// sent (its snapshot is no older). At high rates that takes the check off
// almost every write. A relay that goes idle within that time is not
// notified by those writes; it looks for work again idleSettle after going
// idle, which must be longer than this, so their events wait about
// idleSettle rather than a PollInterval.
const wakeQuietFor = 5 * time.Millisecond

// wakeGate says whether the writes of one schema on one database should ask
// for an idle relay. It is shared by every Writer and goroutine.
type wakeGate struct {
	// quietUntil is when writes must ask again; nil until the first quiet.
	// It keeps time.Now's monotonic reading, so a step of the wall clock
	// cannot quiet a gate for long.
	quietUntil atomic.Pointer[time.Time]
}

// due reports whether a write should ask. A nil gate always asks.
func (g *wakeGate) due() bool {
	if g == nil {
		return true
	}
	until := g.quietUntil.Load()
	return until == nil || !time.Now().Before(*until)
}

// quiet records that a write whose statement was sent at sent (a time.Now
// reading) asked and found no relay idle.
func (g *wakeGate) quiet(sent time.Time) {
	if g == nil {
		return
	}
	until := sent.Add(wakeQuietFor)
	for {
		old := g.quietUntil.Load()
		if old != nil && !old.Before(until) {
			return
		}
		if g.quietUntil.CompareAndSwap(old, &until) {
			return
		}
	}
}

// databaseKey names a database as a connection's configuration does.
type databaseKey struct {
	host     string
	port     uint16
	database string
}

type gateKey struct {
	db     databaseKey
	schema string
}

// wakeGates finds the gate of a write's database and schema. There is one
// set for the process, so that Writers made per request share their gates.
type wakeGates struct {
	// conns maps a weak.Pointer[pgconn.PgConn] to its databaseKey, so that
	// the configuration is copied once per connection, not per write. An
	// entry goes when its connection is garbage collected.
	conns sync.Map
	// gates maps a gateKey to its *wakeGate.
	gates sync.Map
}

var wakeRegistry wakeGates

// forTx returns the gate of tx's database and schema, or nil (every write
// asks) when tx does not say which connection it runs on. It reads only
// what a connection never changes once made, so it is safe to call with a
// finished transaction whose connection another goroutine now uses.
func (gs *wakeGates) forTx(tx pgx.Tx, schema string) (gate *wakeGate) {
	// Some Tx implementations (test doubles among them) panic in Conn.
	defer func() {
		if recover() != nil {
			gate = nil
		}
	}()
	conn := tx.Conn()
	if conn == nil {
		return nil
	}
	pc := conn.PgConn()
	if pc == nil {
		return nil
	}
	wp := weak.Make(pc)
	var db databaseKey
	if v, ok := gs.conns.Load(wp); ok {
		db = v.(databaseKey)
	} else {
		cfg := conn.Config()
		db = databaseKey{host: cfg.Host, port: cfg.Port, database: cfg.Database}
		if _, loaded := gs.conns.LoadOrStore(wp, db); !loaded {
			runtime.AddCleanup(pc, func(wp weak.Pointer[pgconn.PgConn]) { gs.conns.Delete(wp) }, wp)
		}
	}
	key := gateKey{db: db, schema: schema}
	g, ok := gs.gates.Load(key)
	if !ok {
		g, _ = gs.gates.LoadOrStore(key, &wakeGate{})
	}
	return g.(*wakeGate)
}
