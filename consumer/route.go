package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/ordering"
)

// Target is one database a routing consumer applies records in (see
// Route). The consumer's tables (processed keys, positions, parked records,
// dead letters, operator requests) live in each target, each record's in
// its own target, in the transaction of its handler's effect there.
type Target struct {
	// Name names the target in [Route.Owner]'s answers, in logs and in
	// errors. Required, unique within a Route.
	Name string
	// DB is the target's database: its primary. Required.
	DB DB
	// Schema holds the consumer's tables in DB. Default [Config.Schema].
	Schema string
	// SessionConfig connects the target's operator request listener, as
	// [Config.SessionConfig] does for a consumer of one database (which a
	// routing consumer must leave nil): behind a transaction pooler, point
	// it at the target's PostgreSQL server. Default: DB's connection
	// config when DB is a *pgxpool.Pool; otherwise the target's requests
	// are found at each [Config.RequestPoll] alone.
	SessionConfig *pgx.ConnConfig
}

// Route sends each record to the target database that owns its aggregate.
// With [Config.Route] set, Handle and New take a nil database and apply
// each record in its owner's database, through the same handler, whose
// pgx.Tx is then that target's.
//
// A record whose Owner fails, or names no target of Targets, is a poison
// record: it is dead-lettered at once (a *RouteError) in the Fallback
// target, without running the handler, and its offset goes on. Each such
// record gets a letter of its own, later records of its aggregate too:
// none is applied anywhere, so none passes another. Once the route is
// fixed, discard the letters and have the records published again (or
// reset the group's offsets to them): a letter replayed in the fallback
// target that does not own its aggregate is refused.
type Route struct {
	// Targets are the databases records are applied in. At least one.
	Targets []Target
	// Owner returns the name of the target that owns the aggregate, from
	// the record's aggregate type and id as the consumer reads them (the
	// id is the record key when the record has no aggregate id header;
	// both are "" when the record has neither). It is called for every
	// record, from many goroutines at once: keep it a fast lookup without
	// I/O. An error makes the record a poison record (see Route). Required.
	Owner func(aggregateType, aggregateID string) (target string, err error)
	// Fallback names the target that keeps the dead letters of the
	// records Owner cannot place. Default: the first of Targets.
	Fallback string
}

// RouteError is the cause of the dead letter of a record that could not be
// routed: [Route.Owner] failed (Err), or named a target that is not one of
// [Route.Targets] (Target).
type RouteError struct {
	AggregateType, AggregateID string
	// Target is the name Owner returned; "" when it failed.
	Target string
	// Err is Owner's error; nil when it named an unknown target.
	Err error
}

func (e *RouteError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("consumer: route aggregate %q/%q: %v; fix Config.Route.Owner, then replay the record from its topic (this letter is in the fallback target)", e.AggregateType, e.AggregateID, e.Err)
	}
	return fmt.Sprintf("consumer: route aggregate %q/%q: Config.Route.Owner named target %q, which is not one of Config.Route.Targets; add the target or fix Owner, then replay the record from its topic (this letter is in the fallback target)", e.AggregateType, e.AggregateID, e.Target)
}

// Unwrap returns Owner's error.
func (e *RouteError) Unwrap() error { return e.Err }

// router is a routing Processor's own part: a Processor per target.
type router struct {
	owner    func(aggregateType, aggregateID string) (string, error)
	targets  map[string]*Processor
	order    []*Processor // as in Route.Targets
	fallback *Processor
}

// handleRouted is Handle with [Config.Route]: a Processor that routes, and
// one Processor per target, which share its drain signal.
func handleRouted(name string, h Handler, cfg *Config) (*Processor, error) {
	rt := cfg.Route
	if len(rt.Targets) == 0 {
		return nil, errors.New("consumer: Config.Route has no targets; list the target databases in Config.Route.Targets")
	}
	if rt.Owner == nil {
		return nil, errors.New("consumer: Config.Route has no Owner; set Config.Route.Owner to the function that names the target owning an aggregate")
	}
	if cfg.SessionConfig != nil {
		return nil, errors.New("consumer: Config.SessionConfig names one database, and Config.Route applies records in several; leave it nil and set each target's Config.Route.Targets[i].SessionConfig")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c.Route = nil
	p := &Processor{cfg: c, name: name, h: h, ready: make(chan struct{}, 1), log: c.Logger.With(slog.String("consumer", name)),
		route: &router{owner: rt.Owner, targets: map[string]*Processor{}}}
	for i, t := range rt.Targets {
		switch {
		case t.Name == "":
			return nil, fmt.Errorf("consumer: Config.Route.Targets[%d] has no name; name every target", i)
		case t.DB == nil:
			return nil, fmt.Errorf("consumer: target %q has no database; set Config.Route.Targets[%d].DB", t.Name, i)
		case p.route.targets[t.Name] != nil:
			return nil, fmt.Errorf("consumer: target %q is listed twice in Config.Route.Targets; give each target its own name", t.Name)
		}
		tc := c
		if t.Schema != "" {
			tc.Schema = t.Schema
		}
		tc.SessionConfig = t.SessionConfig
		tc.Logger = c.Logger.With(slog.String("target", t.Name))
		tp, err := handle(t.DB, name, h, &tc)
		if err != nil {
			return nil, fmt.Errorf("target %q: %w", t.Name, err)
		}
		tp.target, tp.ready, tp.owner = t.Name, p.ready, p.route
		p.route.targets[t.Name] = tp
		p.route.order = append(p.route.order, tp)
	}
	p.route.fallback = p.route.order[0]
	if rt.Fallback != "" {
		if p.route.fallback = p.route.targets[rt.Fallback]; p.route.fallback == nil {
			return nil, fmt.Errorf("consumer: Config.Route.Fallback names target %q, which is not one of Config.Route.Targets", rt.Fallback)
		}
	}
	return p, nil
}

// Target returns the Processor of the routing Processor's target name, for
// its Inspector, Replay, Discard and ResolveGap; nil when p does not route
// or has no such target. Its records must still be given to p, which
// routes them.
func (p *Processor) Target(name string) *Processor {
	if p.route == nil {
		return nil
	}
	return p.route.targets[name]
}

// errRouting refuses an operation on a routing Processor that belongs to
// one of its targets.
func errRouting(op string) error {
	return fmt.Errorf("consumer: %s on a Processor that routes to several targets: call it on the target that holds the letter, Processor.Target(name).%s", op, op)
}

// aggregateOf reads rec's aggregate as parse does: the type header, and
// the id header, or the record key when it is text.
func aggregateOf(rec *kgo.Record) (typ, id string) {
	if v, ok := header(rec.Headers, outbox.HeaderAggregateType); ok {
		typ = string(v)
	}
	if v, ok := header(rec.Headers, outbox.HeaderAggregateID); ok {
		id = string(v)
	} else if isText(rec.Key) {
		id = string(rec.Key)
	}
	return typ, id
}

// ownerOf returns the target that owns the aggregate typ/id, or the
// RouteError that makes its record poison.
func (r *router) ownerOf(typ, id string) (*Processor, error) {
	name, err := r.owner(typ, id)
	if err != nil {
		return nil, &RouteError{AggregateType: typ, AggregateID: id, Err: err}
	}
	t := r.targets[name]
	if t == nil {
		return nil, &RouteError{AggregateType: typ, AggregateID: id, Target: name}
	}
	return t, nil
}

// process is Process for a routing Processor: rec goes to its owner, or,
// when it has none, to the fallback target's dead letters.
func (r *router) process(ctx context.Context, rec *kgo.Record) (Result, error) {
	t, err := r.ownerOf(aggregateOf(rec))
	if err != nil {
		return r.fallback.poison(ctx, rec, err)
	}
	return t.Process(ctx, rec)
}

// poison dead-letters rec, which could not be routed, in p, traced as a
// record of its own.
func (p *Processor) poison(ctx context.Context, rec *kgo.Record, cause error) (Result, error) {
	return p.traced(ctx, rec, func(ctx context.Context, rec *kgo.Record) (Result, error) {
		return p.deadLetterRecord(ctx, rec, cause)
	})
}

// processBatch is ProcessBatch for a routing Processor: recs are split by
// target, keeping their order, and each target's share is applied through
// its ProcessBatch, one target after another, each in transactions of its
// own. The results are those of the records up to the first that is not
// done in its target; the records after it that are done already are
// given again by the caller, and dedupe skips them.
func (r *router) processBatch(ctx context.Context, recs []*kgo.Record) ([]Result, error) {
	type share struct {
		t    *Processor
		idx  []int
		recs []*kgo.Record
	}
	var (
		shares []*share
		by     = map[*Processor]*share{}
		res    = make([]Result, len(recs))
		done   = make([]bool, len(recs))
		fail   = make([]error, len(recs))
	)
	for i, rec := range recs {
		t, err := r.ownerOf(aggregateOf(rec))
		if err != nil {
			res[i], fail[i] = r.fallback.poison(ctx, rec, err)
			done[i] = fail[i] == nil
			continue
		}
		s := by[t]
		if s == nil {
			s = &share{t: t}
			by[t] = s
			shares = append(shares, s)
		}
		s.idx, s.recs = append(s.idx, i), append(s.recs, rec)
	}
	for _, s := range shares {
		var (
			out []Result
			err error
		)
		if len(s.recs) == 1 {
			var one Result
			if one, err = s.t.Process(ctx, s.recs[0]); err == nil {
				out = []Result{one}
			}
		} else {
			out, err = s.t.ProcessBatch(ctx, s.recs)
		}
		for j, i := range s.idx {
			if j < len(out) {
				res[i], done[i] = out[j], true
			} else {
				fail[i] = err
			}
		}
	}
	n := slices.Index(done, false)
	if n < 0 {
		return res, nil
	}
	return res[:n], fail[n]
}

// each runs f for every target at once and joins their errors, each
// prefixed with its target's name.
func (r *router) each(f func(t *Processor) error) error {
	errs := make([]error, len(r.order))
	var wg sync.WaitGroup
	for i, t := range r.order {
		wg.Go(func() {
			if err := f(t); err != nil {
				errs[i] = fmt.Errorf("target %q: %w", t.target, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// checkOwner refuses to apply m in p when p is a routing Processor's
// target that does not own m's aggregate: a letter kept in the fallback
// target for a record that could not be routed, replayed after the route
// was fixed, belongs elsewhere.
func (p *Processor) checkOwner(id int64, m *Message) error {
	if p.owner == nil {
		return nil
	}
	t, err := p.owner.ownerOf(m.AggregateType, m.AggregateID)
	if err != nil {
		return fmt.Errorf("consumer: replay %d: %w", id, err)
	}
	if t != p {
		return fmt.Errorf("consumer: replay %d: aggregate %q/%q is owned by target %q, not %q where this letter is; nothing was applied: discard the letter here and replay the record from its topic", id, m.AggregateType, m.AggregateID, t.target, p.target)
	}
	return nil
}

// resolveGap is ResolveGap for a routing Processor: the aggregate's owner
// resolves it.
func (r *router) resolveGap(ctx context.Context, agg ordering.Aggregate) (int, error) {
	t, err := r.ownerOf(agg.Type, agg.ID)
	if err != nil {
		return 0, err
	}
	return t.ResolveGap(ctx, agg)
}
