package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

// TestRouteModel is TestModel for a Processor that routes to two targets,
// a and b. The model of a routed consumer is one reference model
// (model_ref_test.go) per target: each target behaves as a one-database
// consumer over the records Route.Owner assigns it, and a record whose
// owner is unknown (Owner fails, or names no target) is dead-lettered in
// the fallback target as the one-database deadLetter would, without its
// handler running. A poll splits as the routing Processor does: one
// record at a time in order, stopping at the first handed back; or, in
// ProcessBatch, the poison records first, then each target's share in
// the order the targets first appear, each through its own model's poll,
// and the results up to the first record not done.
//
// Each iteration draws a mode and a fallback target, then deliveries as
// TestModel draws them over aggregates owned by a (a1, a2, the binary
// key's ""), by b (b1, b2, and "u" of the unsequenced records) and by no
// target (x1), Owner errors for an aggregate and their healing, a fault
// for every event of one target, polls while one target (or both) is
// down, operator actions on either target (Replay, Discard, ResolveGap
// through the routing Processor or a target's, and bulk requests served
// by the owner's request server) and restarts. After every step, per
// target: the tables (effects, processed keys, positions, parked records,
// letters, gaps) equal that target's model, every effect is of an
// aggregate the target owns, and each record's outcome, and its letter,
// is the model's.
// At the end, faults and Owner healed, everything owed delivered, an
// operator clears every letter and gap in each target, and every event is
// applied exactly once in its owner unless it was given up on.
//
// It runs as many sequences as TestModel (setModelChecks); a failure
// prints -rapid.seed=... to reproduce it.
func TestRouteModel(t *testing.T) {
	t.Parallel()
	var targets []*routeModelTarget
	for _, name := range routeModelTargets {
		db := pgtest.New(t, &pgtest.Opts{MaxConns: 10})
		cfg, err := pgxpool.ParseConfig(db.Server.URL)
		require.NoError(t, err)
		cfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
		cfg.MaxConns = 10
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		_, err = pool.Exec(context.Background(), `CREATE TABLE model_effects (
		n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, consumer text NOT NULL, key text NOT NULL, aggregate text NOT NULL, seq bigint NOT NULL);
		CREATE INDEX ON model_effects (consumer, n)`)
		require.NoError(t, err)
		targets = append(targets, &routeModelTarget{name: name, db: db, pool: pool})
	}
	var (
		iteration atomic.Int64
		cov       coverage
	)
	rapid.Check(t, func(rt *rapid.T) {
		h := newRouteHarness(rt, targets, iteration.Add(1))
		h.cov = &cov
		h.run(rt)
	})
	t.Logf("route model: what the sequences did: %s", cov.String())
}

// routeModelTargets are the targets' names, in Route.Targets' order.
var routeModelTargets = []string{"a", "b"}

// routeModelAggs are the aggregates the draws pick from.
var routeModelAggs = []string{"a1", "a2", "b1", "b2", "x1"}

// routeModelTarget is one target database: its schema, and a pool whose
// search_path is that schema, so that the handler's unqualified
// model_effects is the table of the target whose transaction it runs in.
type routeModelTarget struct {
	name string
	db   *pgtest.DB
	pool *pgxpool.Pool
}

// ownerOfAggregate is the route: a1, a2 and "" (a binary key's) are a's;
// b1, b2 and "u" are b's; x1 goes to the target "nowhere", which does not
// exist.
func ownerOfAggregate(id string) string {
	switch {
	case id == "" || strings.HasPrefix(id, "a"):
		return "a"
	case strings.HasPrefix(id, "x"):
		return "nowhere"
	}
	return "b"
}

// routeOwner is Route.Owner: ownerOfAggregate, failing for the aggregates
// in fails. The main goroutine changes fails between steps.
type routeOwner struct {
	mu    sync.Mutex
	fails map[string]bool
}

func (o *routeOwner) owner(_, id string) (string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fails[id] {
		return "", errors.New("model: owner unknown")
	}
	return ownerOfAggregate(id), nil
}

// routeHarness is one iteration of TestRouteModel: a routing Processor in
// one mode, a model per target, and TestModel's record making.
type routeHarness struct {
	*modelHarness
	md       mode
	name     string
	fallback string
	targets  []*routeModelTarget
	tm       map[string]*model   // each target's model
	down     map[string]*outage  // each target's database
	views    map[string]*modeRun // each target's Processor and tables
	routed   *modeRun
	owner    *routeOwner
	handler  consumer.Handler
}

func newRouteHarness(t *rapid.T, targets []*routeModelTarget, iter int64) *routeHarness {
	h := &routeHarness{
		modelHarness: &modelHarness{
			ctx: context.Background(), faults: &faultSet{m: map[string]fault{}}, produced: map[string]int64{},
			events: map[string]*mEvent{}, recs: map[int64]*kgo.Record{}, nextRid: 1, aggs: routeModelAggs,
		},
		md:       rapid.SampledFrom(modes).Draw(t, "mode"),
		fallback: rapid.SampledFrom(routeModelTargets).Draw(t, "fallback"),
		targets:  targets, tm: map[string]*model{}, owner: &routeOwner{fails: map[string]bool{}},
	}
	h.name = fmt.Sprintf("route-model-%d-%s", iter, h.md.name)
	for _, tg := range targets {
		h.tm[tg.name] = newModel(modelMaxAttempts)
		h.models = append(h.models, h.tm[tg.name])
	}
	mh := &modelHandler{name: h.name, table: "model_effects", faults: h.faults}
	h.handler = mh
	if h.md.batchHandler {
		h.handler = modelBatchHandler{mh}
	}
	require.NoError(t, h.start())
	return h
}

// start builds a new routing Processor, as after a restart.
func (h *routeHarness) start() error {
	cfg := &consumer.Config{
		MaxAttempts: modelMaxAttempts, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		HandlerTimeout: modelHandlerTimeout, MaxValueBytes: modelMaxValue, Logger: quietLogger,
		ContentionSpan: -1, // as in TestModel: MaxAttempts alone decides
		Route:          &consumer.Route{Owner: h.owner.owner, Fallback: h.fallback},
	}
	h.down = map[string]*outage{}
	for _, tg := range h.targets {
		h.down[tg.name] = &outage{DB: tg.pool}
		cfg.Route.Targets = append(cfg.Route.Targets, consumer.Target{Name: tg.name, DB: h.down[tg.name], Schema: tg.db.Schema})
	}
	p, err := consumer.Handle(nil, h.name, h.handler, cfg)
	if err != nil {
		return err
	}
	h.routed = &modeRun{md: h.md, name: h.name, p: p}
	if h.views == nil {
		h.views = map[string]*modeRun{}
		for _, tg := range h.targets {
			h.views[tg.name] = &modeRun{md: h.md, name: h.name, db: tg.db, table: tg.db.Table("model_effects")}
		}
	}
	for _, tg := range h.targets {
		h.views[tg.name].p = p.Target(tg.name)
	}
	return nil
}

func (h *routeHarness) run(t *rapid.T) {
	steps := rapid.IntRange(1, 16).Draw(t, "steps")
	for range steps {
		op := rapid.SampledFrom([]string{
			"poll", "poll", "poll", "poll", "poll", "poll",
			"fault", "heal", "target fault", "target heal", "owner fails", "owner heals",
			"replay", "discard", "resolve", "restart", "outage", "outage", "bulk",
		}).Draw(t, "op")
		switch op {
		case "poll":
			h.doPoll(t, h.drawPoll(t), "")
		case "outage":
			h.doPoll(t, h.drawPoll(t), rapid.SampledFrom(append([]string{"*"}, routeModelTargets...)).Draw(t, "down"))
		case "fault":
			h.drawFault(t)
		case "heal":
			h.drawHeal(t)
		case "target fault", "target heal":
			h.doTargetFault(t, op == "target fault")
		case "owner fails", "owner heals":
			agg := rapid.SampledFrom([]string{"a1", "a2", "b1", "b2", "u"}).Draw(t, "owner of")
			h.owner.mu.Lock()
			h.owner.fails[agg] = op == "owner fails"
			h.owner.mu.Unlock()
			h.logf("%s: %s", op, agg)
		case "replay", "discard":
			tg := rapid.SampledFrom(routeModelTargets).Draw(t, "target")
			open := h.tm[tg].openLetters()
			if len(open) == 0 {
				continue
			}
			h.doOperator(t, op, tg, rapid.SampledFrom(open).Draw(t, "letter"), "")
		case "resolve":
			h.doOperator(t, op, "", 0, rapid.SampledFrom(routeModelAggs).Draw(t, "aggregate"))
		case "bulk":
			h.doBulk(t)
		case "restart":
			h.logf("restart")
			require.NoError(t, h.start())
			if rapid.Bool().Draw(t, "offsets lost") && len(h.lastPoll) > 0 {
				h.logf("offsets lost: the last poll again")
				h.doPoll(t, slices.Clone(h.lastPoll), "")
			}
		}
	}
	h.finish(t)
}

// doTargetFault gives every event of one target so far a handler fault
// (an error, or a real serialization failure), or heals them all.
func (h *routeHarness) doTargetFault(t *rapid.T, on bool) {
	tg := rapid.SampledFrom(routeModelTargets).Draw(t, "faulty target")
	f := faultNone
	if on {
		f = rapid.SampledFrom([]fault{faultTransient, faultFail}).Draw(t, "target's fault")
	}
	for _, k := range slices.Sorted(maps.Keys(h.events)) {
		if ownerOfAggregate(h.events[k].agg) == tg {
			h.setFault(k, f)
		}
	}
	h.logf("every event of target %s so far: fault %s", tg, f)
}

// doBulk submits a bulk replay or discard of one aggregate's open letters
// in the target that owns it, served by that target's Processor, and
// compares with its model as TestModel's doBulk does. The aggregate is one
// whose owner Owner names now: a letter of any other in a target is
// refused by Replay there, which the one-database model does not know.
func (h *routeHarness) doBulk(t *rapid.T) {
	var aggs []string
	h.owner.mu.Lock()
	for _, agg := range []string{"a1", "a2", "b1", "b2", "u"} {
		if !h.owner.fails[agg] {
			aggs = append(aggs, agg)
		}
	}
	h.owner.mu.Unlock()
	if len(aggs) == 0 {
		return
	}
	agg := rapid.SampledFrom(aggs).Draw(t, "bulk aggregate")
	action := rapid.SampledFrom([]operator.Action{operator.Replay, operator.Replay, operator.Discard}).Draw(t, "action")
	tg := ownerOfAggregate(agg)
	h.logf("bulk in target %s", tg)
	sub := &modelHarness{ctx: h.ctx, model: h.tm[tg], runs: []*modeRun{h.views[tg]}, cov: h.cov, log: h.log, step: h.step}
	sub.doBulk(t, action, agg)
	h.log, h.step = sub.log, sub.step
	h.check(t)
}

// ownerOf is the target a record goes to, and false when that is the
// fallback because the record has no owner.
func (h *routeHarness) ownerOf(r mRecord) (string, bool) {
	id := r.agg
	if r.kind == recBinaryKey {
		id = ""
	}
	h.owner.mu.Lock()
	fails := h.owner.fails[id]
	h.owner.mu.Unlock()
	if fails {
		return h.fallback, false
	}
	if tg := ownerOfAggregate(id); h.tm[tg] != nil {
		return tg, true
	}
	return h.fallback, false
}

// modelPoll is the routing Processor's poll of recs in the models, with
// the target down (every target for "*") failing every record it is
// given.
func (h *routeHarness) modelPoll(recs []mRecord, down string) []result {
	out := make([]result, len(recs))
	backFrom := func(i int) []result {
		for j := i; j < len(recs); j++ {
			out[j] = result{out: outHandedBack}
		}
		return out
	}
	one := func(r mRecord) result {
		tg, routed := h.ownerOf(r)
		switch {
		case tg == down || down == "*":
			return result{out: outHandedBack}
		case !routed:
			h.cov.add("route:poison")
			return h.tm[tg].deadLetter(r)
		}
		return h.tm[tg].process(r)
	}
	if h.md.batch == 1 {
		for i, r := range recs {
			if out[i] = one(r); out[i].out == outHandedBack {
				return backFrom(i + 1)
			}
		}
		return out
	}
	var order []string
	share := map[string][]int{}
	for i, r := range recs {
		tg, routed := h.ownerOf(r)
		if !routed {
			out[i] = one(r)
			continue
		}
		if share[tg] == nil {
			order = append(order, tg)
		}
		share[tg] = append(share[tg], i)
	}
	if len(order) > 1 {
		h.cov.add("route:batch of two targets")
	}
	for _, tg := range order {
		var rs []mRecord
		for _, i := range share[tg] {
			rs = append(rs, recs[i])
		}
		var res []result
		if tg == down || down == "*" {
			res = make([]result, len(rs))
			for j := range res {
				res[j] = result{out: outHandedBack}
			}
		} else {
			res = h.tm[tg].poll(rs)
		}
		for j, i := range share[tg] {
			out[i] = res[j]
		}
	}
	if n := slices.IndexFunc(out, func(r result) bool { return r.out == outHandedBack }); n >= 0 {
		if slices.ContainsFunc(out[n:], func(r result) bool { return r.out != outHandedBack }) {
			h.cov.add("route:done after one handed back")
		}
		return backFrom(n)
	}
	return out
}

// doPoll hands recs to the routing Processor, with target down (every
// target for "*", none for "") down during the poll, and compares with
// the models.
func (h *routeHarness) doPoll(t *rapid.T, recs []mRecord, down string) {
	if len(recs) == 0 {
		return
	}
	var desc []string
	for _, r := range recs {
		desc = append(desc, fmt.Sprintf("#%d %s %s:%d %s", r.rid, r.kind, r.agg, r.seq, r.key))
	}
	want := h.modelPoll(recs, down)
	for i, w := range want {
		h.cov.add("record:" + recs[i].kind.String() + ":" + w.out.String())
	}
	if down != "" {
		h.cov.add("route:target down")
	}
	h.logf("poll [%s], target down %q -> model %v", strings.Join(desc, ", "), down, want)
	krs := make([]*kgo.Record, len(recs))
	for j, mr := range recs {
		c := *h.recs[mr.rid]
		krs[j] = &c
	}
	for tg, o := range h.down {
		o.on.Store(tg == down || down == "*")
	}
	got, raw := h.routed.poll(h.ctx, krs)
	for _, o := range h.down {
		o.on.Store(false)
	}
	h.pending = nil
	for i, res := range want {
		if res.out == outHandedBack {
			h.pending = append(h.pending, recs[i])
		}
	}
	h.lastPoll = recs
	h.check(t)
	for j, res := range got {
		if res.out != outDeadLettered {
			continue
		}
		got[j].letter = recs[j].rid
		tg, _ := h.ownerOf(recs[j])
		if id, ok := h.views[tg].letters[recs[j].rid]; !ok || id != raw[j].DeadLetterID {
			h.fatalf(t, "record #%d was dead-lettered as letter %d, but its record's letter in target %s is %d", recs[j].rid, raw[j].DeadLetterID, tg, id)
		}
	}
	if !slices.Equal(got, want) {
		h.fatalf(t, "%s: poll results %v, model %v", h.md.name, got, want)
	}
}

// modelReplay is Replay of the letter of rid in target tg: the model's,
// refused when tg does not own the letter's aggregate (any more).
func (h *routeHarness) modelReplay(tg string, rid int64) (result, opErr) {
	m := h.tm[tg]
	if l := m.letters[rid]; l != nil && l.status == deadletter.StatusDead && l.parseOK {
		if owner, routed := h.ownerOf(l.rec); !routed || owner != tg {
			return result{}, errOther
		}
	}
	return m.replay(rid)
}

// doOperator runs Replay or Discard of the letter of rid in target tg, or
// ResolveGap of agg through the routing Processor (tg ""), or through
// target tg's, and compares with the models.
func (h *routeHarness) doOperator(t *rapid.T, op, tg string, rid int64, agg string) {
	var (
		want    result
		wantN   int
		wantErr opErr
	)
	switch op {
	case "replay":
		want, wantErr = h.modelReplay(tg, rid)
	case "discard":
		wantN, wantErr = h.tm[tg].discard(rid)
	case "resolve":
		switch owner, routed := h.ownerOf(mRecord{kind: recGood, agg: agg}); {
		case tg != "":
			wantN, wantErr = h.tm[tg].resolveGap(agg)
		case routed:
			wantN, wantErr = h.tm[owner].resolveGap(agg)
		default:
			wantErr = errOther
		}
	}
	h.logf("%s in target %q #%d %s -> model %v %d %v", op, tg, rid, agg, want, wantN, wantErr)
	h.cov.add(fmt.Sprintf("%s:%v:%v", op, want.out, wantErr))
	var (
		got result
		n   int
		err error
	)
	switch op {
	case "replay":
		var res consumer.Result
		if res, err = h.views[tg].p.Replay(h.ctx, h.views[tg].letters[rid]); err == nil {
			got = result{out: fromOutcome(res.Outcome), drained: res.Drained}
		}
	case "discard":
		n, err = h.views[tg].p.Discard(h.ctx, h.views[tg].letters[rid])
	case "resolve":
		p := h.routed.p
		if tg != "" {
			p = h.views[tg].p
		}
		n, err = p.ResolveGap(h.ctx, ordering.Aggregate{Type: "order", ID: agg})
	}
	h.logf("%s gave %v %d %v", op, got, n, err)
	h.check(t)
	if classifyOpErr(err) != wantErr || got != want || n != wantN {
		h.fatalf(t, "%s: %s in target %q gave %v %d %v (%v), model %v %d %v", h.md.name, op, tg, got, n, classifyOpErr(err), err, want, wantN, wantErr)
	}
}

// check compares each target's tables with its model, and checks that a
// target holds effects of its own aggregates only.
func (h *routeHarness) check(t *rapid.T) map[string]*snapshot {
	snaps := map[string]*snapshot{}
	for _, tg := range routeModelTargets {
		s, err := h.views[tg].snapshot(h.ctx)
		if err != nil {
			h.fatalf(t, "target %s: snapshot: %v", tg, err)
		}
		snaps[tg] = s
		for _, e := range s.effects {
			if owner := ownerOfAggregate(e.agg); owner != tg {
				h.fatalf(t, "target %s holds an effect of %s (%s), which target %q owns", tg, e.agg, e.key, owner)
			}
		}
		compareWithModel(func(format string, args ...any) { h.fatalf(t, format, args...) }, h.md.name+"/"+tg, s, h.tm[tg])
	}
	return snaps
}

// finish heals every fault and the route, delivers what is owed, and has
// an operator clear every letter and gap in each target; then checks that
// every event is applied exactly once, in its owner, unless it was given
// up on deliberately.
func (h *routeHarness) finish(t *rapid.T) {
	for k := range h.models[0].faults {
		h.setFault(k, faultNone)
	}
	h.owner.mu.Lock()
	clear(h.owner.fails)
	h.owner.mu.Unlock()
	h.logf("heal all, Owner too")
	owed := h.owed()
	for len(h.pending) > 0 || len(owed) > 0 {
		n := min(len(owed), 4)
		h.doPoll(t, append(slices.Clone(h.pending), owed[:n]...), "")
		owed = owed[n:]
	}
	for round := 0; round < 20; round++ {
		progress := false
		for _, tg := range routeModelTargets {
			m := h.tm[tg]
			for _, rid := range m.openLetters() {
				saved := m.clone()
				_, replayErr := h.modelReplay(tg, rid)
				m.restore(saved)
				if replayErr == errNone {
					h.doOperator(t, "replay", tg, rid, "")
					progress = true
				} else if _, err := m.clone().discard(rid); err == errNone {
					h.doOperator(t, "discard", tg, rid, "")
					progress = true
				}
			}
			for _, g := range m.gaps() {
				h.doOperator(t, "resolve", tg, 0, g.agg)
				progress = true
			}
		}
		if !progress {
			break
		}
	}
	for _, tg := range routeModelTargets {
		m := h.tm[tg]
		if m.stuck != "" {
			h.fatalf(t, "target %s stuck: %s", tg, m.stuck)
		}
		if gaps := m.gaps(); len(gaps) > 0 {
			h.fatalf(t, "target %s: gaps left after the operator: %v", tg, gaps)
		}
		if open := m.openLetters(); len(open) > 0 {
			h.fatalf(t, "target %s: letters of %v left open", tg, open)
		}
	}
	snaps := h.check(t)
	count := map[string]int{}
	bySeq := map[string]map[int64]string{}
	for _, s := range snaps {
		for _, e := range s.effects {
			count[e.key]++
			if bySeq[e.agg] == nil {
				bySeq[e.agg] = map[int64]string{}
			}
			bySeq[e.agg][e.seq] = e.key
		}
	}
	discarded := func(k string) bool {
		return slices.ContainsFunc(h.models, func(m *model) bool { return m.discarded[k] })
	}
	for _, k := range slices.Sorted(maps.Keys(h.events)) {
		e := h.events[k]
		m := h.tm[ownerOfAggregate(e.agg)]
		switch {
		case count[k] == 1:
		case count[k] > 1:
			h.fatalf(t, "event %s applied %d times", k, count[k])
		case discarded(k):
		case m == nil && (e.lost || !e.delivered):
			// Owned by no target: only ever dead-lettered, when delivered.
		case m == nil:
			h.fatalf(t, "event %s of %s, owned by no target, was delivered but its letter not discarded", k, e.agg)
		case e.seq > 0 && m.skipped[e.agg][e.seq]:
		case e.seq > 0 && bySeq[e.agg][e.seq] != "" && bySeq[e.agg][e.seq] != k:
		case e.seq > 0 && e.lost && e.seq > m.pos[e.agg] && len(m.parked[e.agg]) == 0:
			// Lost at the tail: nothing after it shows the consumer
			// that it exists.
		case e.seq > 0 && e.lost:
			h.fatalf(t, "lost event %s was neither applied nor skipped by an operator", k)
		default:
			h.fatalf(t, "event %s (%s:%d) was never applied and nobody gave up on it", k, e.agg, e.seq)
		}
	}
}
