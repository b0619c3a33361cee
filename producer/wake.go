package producer

import (
	"crypto/md5"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// wakeChannel is the LISTEN/NOTIFY channel of a schema's relays: a hash of
// the schema, so that several outbox schemas in one database wake only their
// own relays and a long schema name cannot overflow the 63-byte limit on
// channel names. It is lower-case letters, digits and an underscore, safe
// as an identifier and inside a string literal.
func wakeChannel(schema string) string {
	sum := md5.Sum([]byte(schema))
	return "outbox_" + hex.EncodeToString(sum[:])[:16]
}

// wakeColumnSQL is the last column of a write's RETURNING when the write
// asks whether a relay is idle: it notifies the relays' channel if one is,
// and says whether it did. The subquery is uncorrelated, so it runs once per
// statement however many rows the statement inserts. NOTIFY is
// transactional: the relays hear of it only if the writer commits.
//
// NOTIFY is not sent from every write because a notifying transaction takes
// a database-wide lock at commit and holds it across the WAL flush, so
// notifying writers commit one at a time (at 16 connections that cost over
// half the commits). An idle relay has little to contend with; a busy one
// claims again straight after each batch and needs no signal.
const wakeColumnSQL = `, (SELECT count(pg_notify('{channel}', ''))
    FROM (SELECT FROM {schema}.relays WHERE idle_until > now() LIMIT 1) AS idle) > 0`

// wakeQuietFor is how long after a write found no relay idle the writes on
// the same database skip the question. At high rates that takes the check
// off almost every write. A relay that goes idle within that time is not
// notified by those writes; it looks for work again idleSettle after going
// idle, which must be longer than this, so their events wait at most about
// idleSettle rather than a PollInterval.
const wakeQuietFor = 5 * time.Millisecond

// wakeGate says whether the writes on one database should ask for an idle
// relay. It is shared by the Writer's goroutines.
type wakeGate struct {
	// quietUntil is when writes must ask again, in UnixNano.
	quietUntil atomic.Int64
}

// due reports whether a write should ask. A nil gate always asks.
func (g *wakeGate) due() bool {
	return g == nil || time.Now().UnixNano() >= g.quietUntil.Load()
}

// quiet records that a write asked and found no relay idle.
func (g *wakeGate) quiet() {
	if g != nil {
		g.quietUntil.Store(time.Now().Add(wakeQuietFor).UnixNano())
	}
}

// wakeGates holds a Writer's gates, one per database it writes to: whether
// a relay is idle on one database says nothing about another.
type wakeGates struct {
	// connKey names the gate in each connection's CustomData, so that the
	// database is looked up once per connection rather than per write.
	connKey string
	// byDatabase maps a databaseKey to its *wakeGate.
	byDatabase sync.Map
}

type databaseKey struct {
	host     string
	port     uint16
	database string
}

var writerSerial atomic.Int64

func newWakeGates() *wakeGates {
	return &wakeGates{connKey: "outbox.producer.wakeGate." + strconv.FormatInt(writerSerial.Add(1), 10)}
}

// forTx returns the gate of tx's database, or nil when tx does not say
// which connection it runs on (then every write asks).
func (gs *wakeGates) forTx(tx pgx.Tx) *wakeGate {
	conn := tx.Conn()
	if conn == nil || conn.PgConn() == nil {
		return nil
	}
	data := conn.PgConn().CustomData()
	if g, ok := data[gs.connKey].(*wakeGate); ok {
		return g
	}
	cfg := conn.Config()
	key := databaseKey{host: cfg.Host, port: cfg.Port, database: cfg.Database}
	g, _ := gs.byDatabase.LoadOrStore(key, &wakeGate{})
	if data != nil {
		data[gs.connKey] = g
	}
	return g.(*wakeGate)
}
