package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/dedupe"
	"github.com/d419a114/outbox/internal/letters"
	"github.com/d419a114/outbox/internal/sequence"
	"github.com/d419a114/outbox/internal/tables"
	"github.com/d419a114/outbox/operator"
)

// Handler applies one message's effect inside tx. It must do all its
// database work in tx: the claim of the message's key, the move of its
// aggregate's position and the effect commit or roll back together.
// Returning an error rolls tx back; the message is retried, or
// dead-lettered at once when the error is Permanent. Work outside the
// database (an email, an HTTP call) is not undone by a rollback and may
// happen more than once. A Handler that also implements BatchHandler
// applies batch mode's batches in one call.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, m *Message) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, m *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, m *Message) error { return f(ctx, tx, m) }

// DB is the database handle a Processor needs: outbox.DB's methods, and
// connections of its own (Acquire), on which it sends BEGIN in one round
// trip with a record's first statement. *pgxpool.Pool satisfies it; a
// wrapper of a pool must offer all of it. Use the primary: dedupe,
// positions and dead letters must never be read from a replica.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Processor applies records through a handler with dedupe, ordering and
// dead-lettering in the handler's transaction. It is safe for concurrent
// use, but records of one partition must be given to it one after another,
// in offset order, for ordering's parking to mean anything.
type Processor struct {
	db       DB
	h        Handler
	bh       BatchHandler // h when it is one, else nil
	cfg      Config
	name     string
	dedupe   *dedupe.Store
	ordering *sequence.Tracker
	dead     *letters.Store
	ops      *operator.Store
	log      *slog.Logger
	// ready wakes [Consumer.Run]'s drainer; see readyToDrain and leftInLine.
	ready chan struct{}
	// faults counts the drain tries of parked records that lost their
	// transaction; see drainFaults.
	faults drainFaults
	// pooler tells a pooler's lost statements from a handler's own; see
	// poolerSeen.
	pooler poolerSeen
	// sql holds the hot path's statements; see tables.HotPath.
	sql tables.HotPath
	// tracer is [Config.Tracer]; batchTracer the same when it is a
	// BatchTracer.
	tracer      Tracer
	batchTracer BatchTracer
	// fallbackKeys rate-limits noteDuplicate's warning.
	fallbackKeys fallbackKeyWarner
	// applied counts the records applied through Process and
	// ProcessBatch, drained ones included.
	applied atomic.Int64
	// requests tunes ServeRequests; the zero value is production's.
	requests requestTuning
	// route is set on a Processor made with [Config.Route], which has no
	// db of its own and hands each record to one of route's Processors.
	route *router
	// target names a routing Processor's target, whose router owner is;
	// "" and nil on a Processor that is not a target.
	target string
	owner  *router
}

// Handle returns a Processor that applies records for the consumer name
// through h, each in a transaction begun on db. Use it inside a poll loop
// you already have: call Process (or ProcessBatch) for each record, and
// mark its offset for commit only when it returns no error. name scopes the
// processed keys, positions and dead letters: give each consuming service
// its own. When h is also a BatchHandler, ProcessBatch applies a batch
// through one HandleBatch call on its happy path.
//
// With [Config.Route] set, db must be nil: the Processor routes each record
// to the target that owns its aggregate (see Route).
func Handle(db DB, name string, h Handler, cfg *Config) (*Processor, error) {
	if cfg != nil && cfg.Route != nil {
		if db != nil {
			return nil, errors.New("consumer: both a database and Config.Route given; pass a nil database when Config.Route names the target databases")
		}
		if h == nil {
			return nil, errors.New("consumer: Handle needs a handler")
		}
		return handleRouted(name, h, cfg)
	}
	if db == nil || h == nil {
		return nil, errors.New("consumer: Handle needs a database (or Config.Route) and a handler")
	}
	return handle(db, name, h, cfg)
}

// handle is Handle for one database.
func handle(db DB, name string, h Handler, cfg *Config) (*Processor, error) {
	if name == "" {
		return nil, errors.New("consumer: empty consumer name; name the consumer, for example after its service")
	}
	if len(name) > outbox.MaxConsumerNameBytes {
		return nil, fmt.Errorf("consumer: name is %d bytes, over the limit of %d (outbox.MaxConsumerNameBytes)", len(name), outbox.MaxConsumerNameBytes)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d, err := dedupe.New(name, &dedupe.Config{Schema: c.Schema, Retention: c.KeyRetention})
	if err != nil {
		return nil, err
	}
	o, err := sequence.New(name, &sequence.Config{Schema: c.Schema, GapPolicy: c.GapPolicy, FirstSeen: c.FirstSeen})
	if err != nil {
		return nil, err
	}
	bh, _ := h.(BatchHandler)
	bt, _ := c.Tracer.(BatchTracer)
	sql := tables.For(c.Schema)
	return &Processor{
		tracer: c.Tracer, batchTracer: bt,
		db: db, h: h, bh: bh, cfg: c, name: name, dedupe: d, ordering: o, ready: make(chan struct{}, 1),
		dead: letters.New(sql.DeadLetters),
		ops:  operator.New(&operator.Config{Schema: c.Schema}),
		log:  c.Logger.With(slog.String("consumer", name)),
		// The claim and the move in one statement, sent in one round trip
		// with BEGIN (see pgpipeline.Begin): at one record per transaction a
		// round trip costs about as much as the record's own work.
		sql: sql.HotPath,
	}, nil
}

// Name returns the consumer name.
func (p *Processor) Name() string { return p.name }

// Inspector returns the Inspector of the Processor's database and schema:
// the reads of its gaps, parked records, positions and dead letters (and
// those of the schema's other consumers). The Processor's own reads are
// those with its Name. A routing Processor ([Config.Route]) returns the
// Inspector of its fallback target; Target(name).Inspector() reads another.
func (p *Processor) Inspector() *Inspector {
	if p.route != nil {
		return p.route.fallback.Inspector()
	}
	return newInspector(p.db, p.cfg.Schema)
}

// appliedCount returns how many records Process and ProcessBatch applied,
// drained ones included: the Consumer's heartbeat reports it.
func (p *Processor) appliedCount() int64 {
	if p.route != nil {
		var n int64
		for _, t := range p.route.order {
			n += t.appliedCount()
		}
		return n
	}
	return p.applied.Load()
}

// Process applies rec in its own transaction and returns what happened. A
// nil error means the record is done with (applied, duplicate, parked or
// dead-lettered) and its offset may be committed. A non-nil error means it
// is not: the database failed, ctx ended, or under ordering.GapFail the
// record waits for a gap (*ordering.GapError); process it again later.
//
// Handler errors are retried with backoff up to [Config.MaxAttempts] (once
// for a Permanent error); then the record is written to the dead-letter
// table in a transaction of its own, and its aggregate's later records are
// parked behind it.
//
// A routing Processor ([Config.Route]) applies rec in the target that owns
// its aggregate, or dead-letters it in the fallback target (see Route).
func (p *Processor) Process(ctx context.Context, rec *kgo.Record) (Result, error) {
	if p.route != nil {
		return p.route.process(ctx, rec)
	}
	return p.traced(ctx, rec, p.processRecord)
}

// processRecord is Process inside the tracer: a record that does not
// parse is dead-lettered at once; any other sets out on its recordRun.
func (p *Processor) processRecord(ctx context.Context, rec *kgo.Record) (Result, error) {
	m, err := parse(rec, p.cfg.KeyFunc, p.cfg.MaxValueBytes)
	if err != nil {
		return p.newRun(m).deadLetter(ctx, err)
	}
	return p.newRun(m).process(ctx, nil)
}

// ordered reports whether m's sequence is checked: it has one and the
// Processor is not [Config.Unordered].
func (p *Processor) ordered(m *Message) bool { return m.HasSeq() && !p.cfg.Unordered }
