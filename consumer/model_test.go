package consumer_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

// TestModel is the model-based test of the Processor: rapid draws
// sequences of deliveries (in order, redelivered, duplicated by the
// producer, reordered, skipped, lost, first seen above 1, a sequence reused
// by another event, malformed in the ways a foreign producer can), handler
// faults per key (transient SQLSTATE 40001, an error, Permanent, a panic, a
// hang past HandlerTimeout), polls during a database outage, healing, operator actions (Replay, Discard,
// ResolveGap, and bulk requests of package operator) and restarts (a new Processor; optionally the last poll
// redelivered, as after a crash between the database commit and the
// offset commit). Each step runs in all three modes (Process one record at
// a time, ProcessBatch with a Handler, ProcessBatch with a BatchHandler),
// each on its own consumer name in one schema, and is checked against the
// reference model of model_ref_test.go, where the rules are written down.
//
// After every step, for every mode:
//   - every effect row has a distinct key (applied at most once), each
//     aggregate's effects are in sequence order, and every applied key is
//     claimed;
//   - every record's outcome is the model's, so every record is accounted
//     for as applied, duplicate, parked, dead-lettered (that letter exists,
//     open) or handed back (and so polled again, first, in the next poll);
//   - processed keys, positions, parked records, dead letters and their
//     statuses, and Gaps are the model's; every parked record is behind a
//     gap (never next in line) and reachable through Gaps;
//   - the three modes agree with each other.
//
// At the end every fault is healed, every record handed back and every
// event not lost is delivered, and an operator replays (else discards)
// every letter and resolves every gap. Then nothing is parked, no letter is
// open, and every event is applied exactly once unless it was deliberately
// given up on: its sequence skipped by an operator, its key claimed by a
// Discard, its sequence taken by another event, or it was malformed.
//
// CI runs modelChecksCI sequences; go test ./consumer -run TestModel with
// -model.long (2000), OUTBOX_MODEL_CHECKS=N or -rapid.checks=N runs more
// (flags after the package). A failure prints -rapid.seed=... (and writes
// a fail file under testdata/rapid) to reproduce it.
func TestModel(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, &pgtest.Opts{MaxConns: 20})
	table := db.Table("model_effects")
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+table+` (
		n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, consumer text NOT NULL, key text NOT NULL, aggregate text NOT NULL, seq bigint NOT NULL);
		CREATE INDEX ON `+table+` (consumer, n)`)
	require.NoError(t, err)
	var (
		iteration atomic.Int64
		cov       coverage
	)
	rapid.Check(t, func(rt *rapid.T) {
		h := newModelHarness(rt, db, table, iteration.Add(1))
		h.cov = &cov
		h.run(rt)
	})
	t.Logf("model: what the sequences did: %s", cov.String())
}

// coverage counts what the sequences did, so that -v shows whether the
// generators reach the interesting states.
type coverage struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *coverage) add(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[what]++
}

func (c *coverage) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, k := range slices.Sorted(maps.Keys(c.n)) {
		out = append(out, fmt.Sprintf("%s=%d", k, c.n[k]))
	}
	return strings.Join(out, " ")
}

// modelChecksCI is how many sequences CI runs: each runs in all three
// modes, about 0.15 s under -race on the project's 2-core machine.
const modelChecksCI = 200

var modelLong = flag.Bool("model.long", false, "TestModel: run 2000 sequences instead of the CI's "+strconv.Itoa(modelChecksCI)+" (or set OUTBOX_MODEL_CHECKS)")

// setModelChecks sets rapid's number of checks for TestModel and
// TestRouteModel, unless the run chose one with -rapid.checks or
// RAPID_CHECKS. rapid reads it from its flag only, so TestMain sets the
// flag before any test runs (set from a parallel test, it raced with the
// package's other rapid tests reading it), and it counts for those tests
// too.
func setModelChecks() error {
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "rapid.checks" })
	if _, env := os.LookupEnv("RAPID_CHECKS"); explicit || env {
		return nil
	}
	n := modelChecksCI
	if *modelLong {
		n = 2000
	}
	if v := os.Getenv("OUTBOX_MODEL_CHECKS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			return fmt.Errorf("OUTBOX_MODEL_CHECKS: %w", err)
		}
	}
	return flag.Set("rapid.checks", strconv.Itoa(n))
}

const (
	modelMaxAttempts    = 2
	modelHandlerTimeout = 50 * time.Millisecond
	modelMaxValue       = 512
)

var modelAggs = []string{"a", "b", "c"}

// faultSet is the handler's faults, shared by the modes; the main
// goroutine writes it between steps.
type faultSet struct {
	mu sync.Mutex
	m  map[string]fault
}

func (fs *faultSet) set(m map[string]fault) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.m = maps.Clone(m)
}

// inject fails as the fault of key says, or returns nil.
func (fs *faultSet) inject(ctx context.Context, tx pgx.Tx, key string) error {
	fs.mu.Lock()
	f := fs.m[key]
	fs.mu.Unlock()
	switch f {
	case faultTransient:
		// A real serialization failure from the server, which aborts
		// the transaction as a real one would.
		_, err := tx.Exec(ctx, `DO $$BEGIN RAISE EXCEPTION 'model: injected serialization failure' USING ERRCODE = '40001'; END$$`)
		if err == nil {
			err = errors.New("model: the injected serialization failure did not fail")
		}
		return err
	case faultFail:
		return errBroken
	case faultPermanent:
		return consumer.Permanent(errBroken)
	case faultPanic:
		panic("model: handler bug for " + key)
	case faultHang:
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// modelHandler writes one effect row per applied message, under its
// consumer's name. The insert ignores the handler's deadline, so that a
// slow machine never turns a healthy record into a HandlerTimeout: only
// faultHang times out.
type modelHandler struct {
	name, table string
	faults      *faultSet
}

func (h *modelHandler) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if err := h.faults.inject(ctx, tx, m.IdempotencyKey); err != nil {
		return err
	}
	_, err := tx.Exec(context.WithoutCancel(ctx), `INSERT INTO `+h.table+` (consumer, key, aggregate, seq) VALUES ($1, $2, $3, $4)`,
		h.name, m.IdempotencyKey, m.AggregateID, m.Seq)
	return err
}

// modelBatchHandler writes a batch's effects in one statement, then fails
// as Handle would for any of its messages.
type modelBatchHandler struct{ *modelHandler }

func (h modelBatchHandler) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	keys, aggs, seqs := make([]string, len(ms)), make([]string, len(ms)), make([]int64, len(ms))
	for i, m := range ms {
		keys[i], aggs[i], seqs[i] = m.IdempotencyKey, m.AggregateID, m.Seq
	}
	_, err := tx.Exec(context.WithoutCancel(ctx), `INSERT INTO `+h.table+` (consumer, key, aggregate, seq)
SELECT $1, k, a, s FROM unnest($2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY AS u (k, a, s, o) ORDER BY o`, h.name, keys, aggs, seqs)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := h.faults.inject(ctx, tx, m.IdempotencyKey); err != nil {
			return err
		}
	}
	return nil
}

// modeRun is one mode's Processor and what the test knows of its tables.
type modeRun struct {
	md   mode
	name string
	h    consumer.Handler
	db   *pgtest.DB
	// table holds the effects, of every mode and iteration.
	table string
	p     *consumer.Processor
	// down is p's database: on during an outage step, between polls off.
	down *outage
	// letters maps a letter's record offset (the model's rid) to its id,
	// from the last snapshot.
	letters map[int64]int64
}

func (r *modeRun) start() error {
	cfg := &consumer.Config{
		Schema: r.db.Schema, MaxAttempts: modelMaxAttempts, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		HandlerTimeout: modelHandlerTimeout, MaxValueBytes: modelMaxValue, Logger: quietLogger,
		// The reference counts a transient fault like any failure:
		// MaxAttempts alone decides, with no span of time to wait out.
		ContentionSpan: -1,
	}
	r.down = &outage{DB: r.db.Pool}
	p, err := consumer.Handle(r.down, r.name, r.h, cfg)
	r.p = p
	return err
}

// poll hands recs to the Processor as the mode does, and returns a result
// per record: those after the first handed back are handed back too.
func (r *modeRun) poll(ctx context.Context, recs []*kgo.Record) ([]result, []consumer.Result) {
	var got []consumer.Result
	if r.md.batch == 1 {
		for _, rec := range recs {
			res, err := r.p.Process(ctx, rec)
			if err != nil {
				break
			}
			got = append(got, res)
		}
	} else {
		got, _ = r.p.ProcessBatch(ctx, recs)
	}
	out := make([]result, len(recs))
	for i := range recs {
		if i >= len(got) {
			out[i] = result{out: outHandedBack}
			continue
		}
		out[i] = result{out: fromOutcome(got[i].Outcome), drained: got[i].Drained}
	}
	return out, got
}

func fromOutcome(o consumer.Outcome) outcome {
	switch o {
	case consumer.Applied:
		return outApplied
	case consumer.Duplicate:
		return outDuplicate
	case consumer.Parked:
		return outParked
	case consumer.DeadLettered:
		return outDeadLettered
	}
	return 0
}

func classifyOpErr(err error) opErr {
	switch {
	case err == nil:
		return errNone
	case errors.Is(err, deadletter.ErrResolved):
		return errResolved
	case errors.Is(err, consumer.ErrSequencePassed):
		return errPassed
	case errors.Is(err, consumer.ErrNotNext):
		return errNotNext
	}
	return errOther
}

// snapshot is one mode's tables.
type snapshot struct {
	effects   []effectRow
	claimed   map[string]bool
	positions map[string][2]int64 // last_seq, parked
	parked    map[string]map[int64]mParked
	letters   map[int64]snapLetter // by record offset
	gaps      []ordering.OpenGap
}

type effectRow struct {
	key, agg string
	seq      int64
}

type snapLetter struct {
	id       int64
	key, agg string
	seq      int64
	status   deadletter.Status
}

func (r *modeRun) snapshot(ctx context.Context) (*snapshot, error) {
	s := &snapshot{claimed: map[string]bool{}, positions: map[string][2]int64{}, parked: map[string]map[int64]mParked{}, letters: map[int64]snapLetter{}}
	b := &pgx.Batch{}
	b.Queue(`SELECT key, aggregate, seq FROM `+r.table+` WHERE consumer = $1 ORDER BY n`, r.name).Query(func(rows pgx.Rows) error {
		var err error
		s.effects, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (effectRow, error) {
			var e effectRow
			return e, row.Scan(&e.key, &e.agg, &e.seq)
		})
		return err
	})
	b.Queue(`SELECT key FROM `+r.db.Table("processed_keys")+` WHERE consumer = $1`, r.name).Query(func(rows pgx.Rows) error {
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, k := range keys {
			s.claimed[k] = true
		}
		return err
	})
	b.Queue(`SELECT aggregate_id, last_seq, parked FROM `+r.db.Table("positions")+` WHERE consumer = $1`, r.name).Query(func(rows pgx.Rows) error {
		_, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
			var (
				agg          string
				last, parked int64
			)
			err := row.Scan(&agg, &last, &parked)
			s.positions[agg] = [2]int64{last, parked}
			return struct{}{}, err
		})
		return err
	})
	b.Queue(`SELECT aggregate_id, seq, kafka_offset, coalesce(idempotency_key, '') FROM `+r.db.Table("parked")+` WHERE consumer = $1`, r.name).Query(func(rows pgx.Rows) error {
		_, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
			var (
				agg      string
				seq, off int64
				key      string
			)
			err := row.Scan(&agg, &seq, &off, &key)
			if s.parked[agg] == nil {
				s.parked[agg] = map[int64]mParked{}
			}
			s.parked[agg][seq] = mParked{rid: off, key: key}
			return struct{}{}, err
		})
		return err
	})
	b.Queue(`SELECT id, kafka_offset, coalesce(idempotency_key, ''), coalesce(aggregate_id, ''), coalesce(aggregate_seq, 0), status
FROM `+r.db.Table("dead_letters")+` WHERE consumer = $1`, r.name).Query(func(rows pgx.Rows) error {
		_, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
			var (
				l   snapLetter
				off int64
			)
			err := row.Scan(&l.id, &off, &l.key, &l.agg, &l.seq, &l.status)
			if _, twice := s.letters[off]; twice {
				return struct{}{}, fmt.Errorf("two dead letters for the record at offset %d", off)
			}
			s.letters[off] = l
			return struct{}{}, err
		})
		return err
	})
	if err := r.db.Pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	// Every aggregate's gap as ResolveGap reads it (a gap needs a
	// position), and the Inspector's pages: those of them with records
	// parked.
	var paged []ordering.OpenGap
	for _, agg := range slices.Sorted(maps.Keys(s.positions)) {
		g, err := consumer.GapOf(ctx, r.p, ordering.Aggregate{Type: "order", ID: agg})
		if err != nil {
			return nil, err
		}
		if g == nil {
			continue
		}
		s.gaps = append(s.gaps, *g)
		if g.Parked > 0 {
			p := *g
			p.Since = time.Time{} // the oldest parked here, the lowest's there
			paged = append(paged, p)
		}
	}
	pages, err := allGaps(ctx, r.p)
	if err != nil {
		return nil, err
	}
	for i := range pages {
		pages[i].Since = time.Time{}
	}
	if !reflect.DeepEqual(pages, paged) {
		return nil, fmt.Errorf("the Inspector's gaps %+v are not the parked ones of the gaps %+v", pages, s.gaps)
	}
	r.letters = map[int64]int64{}
	for off, l := range s.letters {
		r.letters[off] = l.id
	}
	return s, nil
}

// modelHarness is one iteration: the model, the three modes, and the
// records made so far.
type modelHarness struct {
	ctx    context.Context
	model  *model
	faults *faultSet
	runs   []*modeRun
	// produced is each aggregate's last sequence written by the producer.
	produced map[string]int64
	// events are the producer's events by key, with where they stand.
	events map[string]*mEvent
	// delivered are the record instances delivered so far, by rid.
	delivered []mRecord
	recs      map[int64]*kgo.Record
	// pending are the records handed back, polled again first.
	pending []mRecord
	// lastPoll is the last poll as delivered, for a crash before the
	// offset commit.
	lastPoll []mRecord
	nextRid  int64
	nextKey  int
	// aggs are the aggregates the draws pick from (modelAggs here).
	aggs []string
	// models are the models whose faults setFault keeps: model here, each
	// target's in TestRouteModel.
	models []*model
	cov    *coverage
	step   int
	log    []string
}

// mEvent is one event the producer wrote: (agg, seq, key).
type mEvent struct {
	agg       string
	seq       int64
	key       string
	delivered bool
	lost      bool // never to be delivered
	reuse     bool // it reuses another event's sequence
}

func newModelHarness(t *rapid.T, db *pgtest.DB, table string, iter int64) *modelHarness {
	h := &modelHarness{
		ctx: context.Background(), model: newModel(modelMaxAttempts), faults: &faultSet{m: map[string]fault{}},
		produced: map[string]int64{}, events: map[string]*mEvent{}, recs: map[int64]*kgo.Record{}, nextRid: 1, aggs: modelAggs,
	}
	h.models = []*model{h.model}
	for _, md := range modes {
		name := fmt.Sprintf("model-%d-%s", iter, md.name)
		mh := &modelHandler{name: name, table: table, faults: h.faults}
		var hd consumer.Handler = mh
		if md.batchHandler {
			hd = modelBatchHandler{mh}
		}
		r := &modeRun{md: md, name: name, h: hd, db: db, table: table}
		require.NoError(t, r.start())
		h.runs = append(h.runs, r)
	}
	return h
}

func (h *modelHarness) run(t *rapid.T) {
	steps := rapid.IntRange(1, 24).Draw(t, "steps")
	for range steps {
		op := rapid.SampledFrom([]string{
			"poll", "poll", "poll", "poll", "poll", "poll",
			"fault", "heal", "replay", "discard", "resolve", "restart", "bulk", "outage",
		}).Draw(t, "op")
		switch op {
		case "poll":
			h.doPoll(t, h.drawPoll(t))
		case "outage":
			h.doOutage(t, h.drawPoll(t))
		case "fault":
			h.drawFault(t)
		case "heal":
			h.drawHeal(t)
		case "replay", "discard":
			open := h.model.openLetters()
			if len(open) == 0 {
				continue
			}
			rid := rapid.SampledFrom(open).Draw(t, "letter")
			h.doOperator(t, op, rid, "")
		case "resolve":
			h.doOperator(t, op, 0, rapid.SampledFrom(modelAggs).Draw(t, "aggregate"))
		case "restart":
			h.doRestart(t, rapid.Bool().Draw(t, "offsets lost"))
		case "bulk":
			action := rapid.SampledFrom([]operator.Action{operator.Replay, operator.Replay, operator.Discard}).Draw(t, "action")
			h.doBulk(t, action, rapid.SampledFrom(append([]string{""}, modelAggs...)).Draw(t, "aggregate"))
		}
	}
	h.finish(t)
}

// drawPoll draws a poll of one to four records; the records handed back
// before come first.
func (h *modelHarness) drawPoll(t *rapid.T) []mRecord {
	recs := slices.Clone(h.pending)
	n := rapid.IntRange(1, 4).Draw(t, "poll size")
	for range n {
		kind := rapid.SampledFrom([]string{
			"next", "next", "next", "next", "skip", "redeliver", "duplicate", "late", "reuse", "malformed", "noseq",
		}).Draw(t, "delivery")
		switch kind {
		case "next":
			e := h.produce(t, rapid.SampledFrom(h.aggs).Draw(t, "aggregate"))
			recs = append(recs, h.instance(mRecord{kind: recGood, agg: e.agg, seq: e.seq, key: e.key}))
			e.delivered = true
		case "skip":
			// Events written but not delivered now: late, or lost for
			// good (then only an operator's ResolveGap gets past them).
			agg := rapid.SampledFrom(h.aggs).Draw(t, "aggregate")
			lost := rapid.IntRange(0, 2).Draw(t, "lost") == 0
			for range rapid.IntRange(1, 2).Draw(t, "skipped") {
				h.produce(t, agg).lost = lost
			}
		case "redeliver":
			if len(h.delivered) > 0 {
				recs = append(recs, rapid.SampledFrom(h.delivered).Draw(t, "redelivered"))
			}
		case "duplicate":
			if e := h.drawEvent(t, func(e *mEvent) bool { return e.delivered }); e != nil {
				recs = append(recs, h.instance(mRecord{kind: recGood, agg: e.agg, seq: e.seq, key: e.key}))
			}
		case "late":
			if e := h.drawEvent(t, func(e *mEvent) bool { return !e.delivered && !e.lost }); e != nil {
				recs = append(recs, h.instance(mRecord{kind: recGood, agg: e.agg, seq: e.seq, key: e.key}))
				e.delivered = true
			}
		case "reuse":
			agg := rapid.SampledFrom(h.aggs).Draw(t, "aggregate")
			if h.produced[agg] == 0 {
				continue
			}
			seq := rapid.Int64Range(1, h.produced[agg]).Draw(t, "reused seq")
			h.nextKey++
			e := &mEvent{agg: agg, seq: seq, key: fmt.Sprintf("%s-%d-r%d", agg, seq, h.nextKey), delivered: true, reuse: true}
			h.events[e.key] = e
			h.drawNewFault(t, e.key)
			recs = append(recs, h.instance(mRecord{kind: recGood, agg: agg, seq: seq, key: e.key}))
		case "malformed":
			recs = append(recs, h.drawMalformed(t))
		case "noseq":
			h.nextKey++
			e := &mEvent{agg: "u", key: fmt.Sprintf("u-%d", h.nextKey), delivered: true}
			h.events[e.key] = e
			h.drawNewFault(t, e.key)
			recs = append(recs, h.instance(mRecord{kind: recNoSeq, agg: "u", key: e.key}))
		}
	}
	return recs
}

// drawMalformed draws a record a foreign producer could send: carrying an
// existing event's key (a claimed key makes it a Duplicate) or a key of
// its own.
func (h *modelHarness) drawMalformed(t *rapid.T) mRecord {
	kind := rapid.SampledFrom([]recKind{recBadSeq, recTwoSeqs, recLongKey, recBinaryKey, recBigValue}).Draw(t, "malformed")
	agg := rapid.SampledFrom(h.aggs).Draw(t, "aggregate")
	seq := rapid.Int64Range(1, h.produced[agg]+2).Draw(t, "seq")
	h.nextKey++
	key := fmt.Sprintf("g-%d", h.nextKey)
	if e := h.drawEvent(t, func(e *mEvent) bool { return e.agg == agg && !e.reuse }); e != nil && rapid.Bool().Draw(t, "event's key") {
		key, seq = e.key, e.seq
	}
	return h.instance(mRecord{kind: kind, agg: agg, seq: seq, key: key})
}

func (h *modelHarness) produce(t *rapid.T, agg string) *mEvent {
	h.produced[agg]++
	e := &mEvent{agg: agg, seq: h.produced[agg], key: fmt.Sprintf("%s-%d", agg, h.produced[agg])}
	h.events[e.key] = e
	h.drawNewFault(t, e.key)
	return e
}

// drawNewFault gives a new event's key a fault, now and then.
func (h *modelHarness) drawNewFault(t *rapid.T, key string) {
	f := rapid.SampledFrom([]fault{
		faultNone, faultNone, faultNone, faultNone, faultNone, faultNone, faultNone, faultNone, faultNone, faultNone,
		faultNone, faultNone, faultTransient, faultFail, faultPermanent, faultPanic,
	}).Draw(t, "fault")
	if f == faultNone && rapid.IntRange(0, 40).Draw(t, "hang") == 0 {
		f = faultHang
	}
	h.setFault(key, f)
}

func (h *modelHarness) setFault(key string, f fault) {
	for _, m := range h.models {
		if f == faultNone {
			delete(m.faults, key)
		} else {
			m.faults[key] = f
		}
	}
	h.faults.set(h.models[0].faults)
}

func (h *modelHarness) drawFault(t *rapid.T) {
	if e := h.drawEvent(t, func(*mEvent) bool { return true }); e != nil {
		f := rapid.SampledFrom([]fault{faultTransient, faultFail, faultPermanent, faultPanic, faultHang}).Draw(t, "new fault")
		h.setFault(e.key, f)
		h.logf("fault %s: %s", e.key, f)
	}
}

func (h *modelHarness) drawHeal(t *rapid.T) {
	keys := slices.Sorted(maps.Keys(h.models[0].faults))
	if len(keys) == 0 {
		return
	}
	k := rapid.SampledFrom(keys).Draw(t, "healed")
	h.setFault(k, faultNone)
	h.logf("heal %s", k)
}

// drawEvent draws one of the events that match, or returns nil.
func (h *modelHarness) drawEvent(t *rapid.T, match func(*mEvent) bool) *mEvent {
	var keys []string
	for k, e := range h.events {
		if match(e) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	sort.Strings(keys)
	return h.events[rapid.SampledFrom(keys).Draw(t, "event")]
}

// owed is what finish delivers: a record of every event neither delivered
// nor lost, in sequence order, each now counted as delivered.
func (h *modelHarness) owed() []mRecord {
	var owed []mRecord
	for _, k := range slices.Sorted(maps.Keys(h.events)) {
		if e := h.events[k]; !e.delivered && !e.lost {
			owed = append(owed, h.instance(mRecord{kind: recGood, agg: e.agg, seq: e.seq, key: e.key}))
			e.delivered = true
		}
	}
	sort.SliceStable(owed, func(i, j int) bool { return owed[i].seq < owed[j].seq })
	return owed
}

// instance gives r a rid (its offset) and builds its record.
func (h *modelHarness) instance(r mRecord) mRecord {
	r.rid = h.nextRid
	h.nextRid++
	h.recs[r.rid] = buildRecord(r)
	h.delivered = append(h.delivered, r)
	return r
}

func buildRecord(r mRecord) *kgo.Record {
	var kr *kgo.Record
	switch r.kind {
	case recGood, recNoSeq:
		kr = rec(r.agg, r.seq, r.key)
	case recBadSeq:
		kr = rec(r.agg, 0, r.key)
		bad := []string{"x", "0", "-3", "1.5", ""}[r.seq%5]
		kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: outbox.HeaderAggregateSeq, Value: []byte(bad)})
	case recTwoSeqs:
		kr = rec(r.agg, r.seq, r.key)
		kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: outbox.HeaderAggregateSeq, Value: []byte(strconv.FormatInt(r.seq+1, 10))})
	case recLongKey:
		kr = rec(r.agg, r.seq, r.key)
		kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: outbox.HeaderIdempotencyKey,
			Value: []byte(r.key + strings.Repeat("k", outbox.MaxIdempotencyKeyBytes))})
	case recBinaryKey:
		kr = &kgo.Record{Key: []byte{0xff, 0xfe, r.agg[0]}, Value: []byte("binary"), Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderEventID, Value: []byte(r.key)},
			{Key: outbox.HeaderAggregateType, Value: []byte("order")},
			{Key: outbox.HeaderAggregateSeq, Value: []byte(strconv.FormatInt(r.seq, 10))},
		}}
	case recBigValue:
		kr = rec(r.agg, r.seq, r.key)
		kr.Value = []byte(strings.Repeat("v", modelMaxValue+1))
	}
	kr.Topic, kr.Offset = "orders", r.rid
	return kr
}

func (h *modelHarness) logf(format string, args ...any) {
	h.step++
	h.log = append(h.log, fmt.Sprintf("%d: ", h.step)+fmt.Sprintf(format, args...))
}

// inModes runs f for every mode at once, each on its own goroutine, and
// returns their errors.
func (h *modelHarness) inModes(f func(i int, r *modeRun) error) []error {
	errs := make([]error, len(h.runs))
	var wg sync.WaitGroup
	for i, r := range h.runs {
		wg.Go(func() { errs[i] = f(i, r) })
	}
	wg.Wait()
	return errs
}

func (h *modelHarness) doPoll(t *rapid.T, recs []mRecord) {
	if len(recs) == 0 {
		return
	}
	var desc []string
	for _, r := range recs {
		desc = append(desc, fmt.Sprintf("#%d %s %s:%d %s", r.rid, r.kind, r.agg, r.seq, r.key))
	}
	want := h.model.poll(recs)
	for i, w := range want {
		h.cov.add("record:" + recs[i].kind.String() + ":" + w.out.String())
		if w.drained > 0 {
			h.cov.add("drained")
		}
		if f := h.model.faults[recs[i].key]; f != faultNone {
			h.cov.add("fault:" + f.String() + ":" + w.out.String())
		}
	}
	h.logf("poll [%s] -> model %v", strings.Join(desc, ", "), want)
	got := make([][]result, len(h.runs))
	raw := make([][]consumer.Result, len(h.runs))
	h.inModes(func(i int, r *modeRun) error {
		krs := make([]*kgo.Record, len(recs))
		for j, mr := range recs {
			c := *h.recs[mr.rid]
			krs[j] = &c
		}
		got[i], raw[i] = r.poll(h.ctx, krs)
		return nil
	})
	h.pending = nil
	for i, res := range want {
		if res.out == outHandedBack {
			h.pending = append(h.pending, recs[i])
		}
	}
	h.lastPoll = recs
	snaps := h.check(t)
	for i, r := range h.runs {
		// The letter a record went to is the model's.
		for j, res := range got[i] {
			if res.out == outDeadLettered && j < len(want) {
				res.letter = recs[j].rid
				got[i][j] = res
				if id, ok := r.letters[recs[j].rid]; !ok || id != raw[i][j].DeadLetterID {
					h.fatalf(t, "%s: record #%d was dead-lettered as letter %d, but its record's letter is %d", r.md.name, recs[j].rid, raw[i][j].DeadLetterID, id)
				}
			}
		}
		if !slices.Equal(got[i], want) {
			h.fatalf(t, "%s: poll results %v, model %v", r.md.name, got[i], want)
		}
	}
	for i := 1; i < len(h.runs); i++ {
		if !slices.Equal(got[i], got[0]) {
			h.fatalf(t, "modes disagree: %s %v, %s %v", h.runs[0].md.name, got[0], h.runs[i].md.name, got[i])
		}
	}
	_ = snaps
}

// doOutage hands recs to every mode while the database is down: every
// record is handed back, and nothing changes, nothing is dead-lettered.
func (h *modelHarness) doOutage(t *rapid.T, recs []mRecord) {
	if len(recs) == 0 {
		return
	}
	h.logf("outage poll of %d records", len(recs))
	got := make([][]result, len(h.runs))
	h.inModes(func(i int, r *modeRun) error {
		krs := make([]*kgo.Record, len(recs))
		for j, mr := range recs {
			c := *h.recs[mr.rid]
			krs[j] = &c
		}
		r.down.on.Store(true)
		defer r.down.on.Store(false)
		got[i], _ = r.poll(h.ctx, krs)
		return nil
	})
	want := make([]result, len(recs))
	for i := range want {
		want[i] = result{out: outHandedBack}
	}
	for i, r := range h.runs {
		if !slices.Equal(got[i], want) {
			h.fatalf(t, "%s: outage poll results %v, want every record handed back", r.md.name, got[i])
		}
	}
	h.cov.add("outage")
	h.pending = recs
	h.lastPoll = recs
	h.check(t)
}

// doOperator runs Replay or Discard of the letter of rid, or ResolveGap of
// agg, in every mode, and compares with the model.
func (h *modelHarness) doOperator(t *rapid.T, op string, rid int64, agg string) {
	var (
		want    result
		wantN   int
		wantErr opErr
	)
	switch op {
	case "replay":
		want, wantErr = h.model.replay(rid)
	case "discard":
		wantN, wantErr = h.model.discard(rid)
	case "resolve":
		wantN, wantErr = h.model.resolveGap(agg)
	}
	h.logf("%s #%d %s -> model %v %d %v", op, rid, agg, want, wantN, wantErr)
	h.cov.add(fmt.Sprintf("%s:%v:%v", op, want.out, wantErr))
	type answer struct {
		res result
		n   int
		err opErr
		msg string
	}
	answers := make([]answer, len(h.runs))
	h.inModes(func(i int, r *modeRun) error {
		var err error
		switch op {
		case "replay":
			var res consumer.Result
			res, err = r.p.Replay(h.ctx, r.letters[rid])
			if err == nil {
				answers[i].res = result{out: fromOutcome(res.Outcome), drained: res.Drained}
			}
		case "discard":
			answers[i].n, err = r.p.Discard(h.ctx, r.letters[rid])
		case "resolve":
			answers[i].n, err = r.p.ResolveGap(h.ctx, ordering.Aggregate{Type: "order", ID: agg})
		}
		answers[i].err = classifyOpErr(err)
		if err != nil {
			answers[i].msg = err.Error()
		}
		return nil
	})
	h.check(t)
	for i, r := range h.runs {
		a := answers[i]
		if a.err != wantErr || a.res != want || a.n != wantN {
			h.fatalf(t, "%s: %s gave %v %d %v (%s), model %v %d %v", r.md.name, op, a.res, a.n, a.err, a.msg, want, wantN, wantErr)
		}
	}
}

// doRestart drops every mode's Processor and builds a new one; with lost,
// the last poll's offsets were never committed, so it comes again.
func (h *modelHarness) doRestart(t *rapid.T, lost bool) {
	h.logf("restart, offsets lost: %v", lost)
	for _, err := range h.inModes(func(_ int, r *modeRun) error { return r.start() }) {
		require.NoError(t, err)
	}
	if lost && len(h.lastPoll) > 0 {
		h.doPoll(t, slices.Clone(h.lastPoll))
	}
}

// finish heals every fault, delivers what is owed, and lets an operator
// clear every letter and gap; then checks that every event is applied
// exactly once unless it was given up on deliberately.
func (h *modelHarness) finish(t *rapid.T) {
	for k := range h.model.faults {
		h.setFault(k, faultNone)
	}
	h.logf("heal all")
	owed := h.owed()
	for len(h.pending) > 0 || len(owed) > 0 {
		n := min(len(owed), 4)
		h.doPoll(t, append(slices.Clone(h.pending), owed[:n]...))
		owed = owed[n:]
	}
	for round := 0; round < 20; round++ {
		progress := false
		for _, rid := range h.model.openLetters() {
			if _, err := h.model.clone().replay(rid); err == errNone {
				h.doOperator(t, "replay", rid, "")
				progress = true
			} else if _, err := h.model.clone().discard(rid); err == errNone {
				h.doOperator(t, "discard", rid, "")
				progress = true
			}
		}
		for _, g := range h.model.gaps() {
			h.doOperator(t, "resolve", 0, g.agg)
			progress = true
		}
		if !progress {
			break
		}
	}
	if h.model.stuck != "" {
		h.fatalf(t, "stuck: %s", h.model.stuck)
	}
	snaps := h.check(t)
	if gaps := h.model.gaps(); len(gaps) > 0 {
		h.fatalf(t, "gaps left after the operator: %v", gaps)
	}
	for _, rid := range h.model.openLetters() {
		l := h.model.letters[rid]
		h.fatalf(t, "letter of #%d (%s:%d %s) left open", rid, l.agg, l.seq, l.key)
	}
	for i, r := range h.runs {
		s := snaps[i]
		count := map[string]int{}
		bySeq := map[string]map[int64]string{}
		for _, e := range s.effects {
			count[e.key]++
			if bySeq[e.agg] == nil {
				bySeq[e.agg] = map[int64]string{}
			}
			bySeq[e.agg][e.seq] = e.key
		}
		for _, k := range slices.Sorted(maps.Keys(h.events)) {
			e := h.events[k]
			switch {
			case count[k] == 1:
			case count[k] > 1:
				h.fatalf(t, "%s: event %s applied %d times", r.md.name, k, count[k])
			case h.model.discarded[k]:
			case e.seq > 0 && h.model.skipped[e.agg][e.seq]:
			case e.seq > 0 && bySeq[e.agg][e.seq] != "" && bySeq[e.agg][e.seq] != k:
			case e.seq > 0 && e.lost && e.seq > h.model.pos[e.agg] && len(h.model.parked[e.agg]) == 0:
				// Lost at the tail: nothing after it shows the consumer
				// that it exists.
			case e.seq > 0 && e.lost:
				h.fatalf(t, "%s: lost event %s was neither applied nor skipped by an operator", r.md.name, k)
			default:
				h.fatalf(t, "%s: event %s (%s:%d) was never applied and nobody gave up on it", r.md.name, k, e.agg, e.seq)
			}
		}
	}
}

// check compares every mode's tables with the model and with each other,
// and returns the snapshots.
func (h *modelHarness) check(t *rapid.T) []*snapshot {
	snaps := make([]*snapshot, len(h.runs))
	for i, err := range h.inModes(func(i int, r *modeRun) error {
		var err error
		snaps[i], err = r.snapshot(h.ctx)
		return err
	}) {
		if err != nil {
			h.fatalf(t, "%s: snapshot: %v", h.runs[i].md.name, err)
		}
	}
	for i, r := range h.runs {
		compareWithModel(func(format string, args ...any) { h.fatalf(t, format, args...) }, r.md.name, snaps[i], h.model)
	}
	return snaps
}

// compareWithModel checks one Processor's tables s, named name, against
// the invariants that hold whatever the model says and against m, and
// calls fail for the first difference.
func compareWithModel(fail func(format string, args ...any), name string, s *snapshot, m *model) {
	// Invariants that hold whatever the model says.
	seen := map[string]bool{}
	last := map[string]int64{}
	applied := map[string][]string{}
	for _, e := range s.effects {
		if seen[e.key] {
			fail("%s: effect of %s applied twice", name, e.key)
		}
		seen[e.key] = true
		if e.seq > 0 {
			if e.seq <= last[e.agg] {
				fail("%s: %s applied seq %d after %d", name, e.agg, e.seq, last[e.agg])
			}
			last[e.agg] = e.seq
		}
		if !s.claimed[e.key] {
			fail("%s: applied key %s is not claimed", name, e.key)
		}
		applied[e.agg] = append(applied[e.agg], e.key)
	}
	gapOf := map[string]ordering.OpenGap{}
	for _, g := range s.gaps {
		gapOf[g.Aggregate.ID] = g
	}
	for agg, ps := range s.parked {
		g, ok := gapOf[agg]
		if !ok {
			fail("%s: %d records of %s are parked, but Gaps does not list it", name, len(ps), agg)
		}
		for seq, p := range ps {
			if seq <= g.Last+1 {
				fail("%s: parked %s:%d is next in line (position %d) but was not drained", name, agg, seq, g.Last)
			}
			if !s.claimed[p.key] {
				fail("%s: parked %s:%d's key %s is not claimed", name, agg, seq, p.key)
			}
		}
	}
	// The model.
	for _, agg := range slices.Sorted(maps.Keys(unionKeys(applied, m.applied))) {
		if !slices.Equal(applied[agg], m.applied[agg]) {
			fail("%s: %s applied %v, model %v", name, agg, applied[agg], m.applied[agg])
		}
	}
	if !maps.Equal(s.claimed, m.claimed) {
		fail("%s: claimed keys %v, model %v", name, slices.Sorted(maps.Keys(s.claimed)), slices.Sorted(maps.Keys(m.claimed)))
	}
	for agg := range unionKeys(s.positions, m.pos) {
		if got := s.positions[agg]; got[0] != m.pos[agg] || got[1] != int64(len(m.parked[agg])) {
			fail("%s: position of %s is %d with %d parked, model %d with %d", name, agg, got[0], got[1], m.pos[agg], len(m.parked[agg]))
		}
	}
	for agg := range unionKeys(s.parked, m.parked) {
		if !maps.Equal(s.parked[agg], m.parked[agg]) && len(s.parked[agg])+len(m.parked[agg]) > 0 {
			fail("%s: parked of %s %v, model %v", name, agg, s.parked[agg], m.parked[agg])
		}
	}
	for rid := range unionKeys(s.letters, m.letters) {
		got, ok := s.letters[rid]
		want := m.letters[rid]
		if !ok || want == nil || got.status != want.status || got.key != want.key || got.seq != want.seq ||
			(want.seq > 0 && got.agg != want.agg) {
			fail("%s: letter of #%d is %+v, model %+v", name, rid, got, want)
		}
	}
	wantGaps := m.gaps()
	if len(s.gaps) != len(wantGaps) {
		fail("%s: gaps %+v, model %+v", name, s.gaps, wantGaps)
	}
	for j, g := range s.gaps {
		w := wantGaps[j]
		if g.Aggregate.ID != w.agg || g.Expected != w.expected || g.FirstParked != w.firstParked || g.Parked != w.parked || g.DeadLetterSeq != w.letterSeq {
			fail("%s: gap %+v, model %+v", name, g, w)
		}
	}
}

func unionKeys[K comparable, V1, V2 any](a map[K]V1, b map[K]V2) map[K]bool {
	out := map[K]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// fatalf fails the iteration with the steps so far, so that the shrunk
// sequence reads as a story.
func (h *modelHarness) fatalf(t *rapid.T, format string, args ...any) {
	t.Helper()
	t.Fatalf("%s\nsteps:\n  %s", fmt.Sprintf(format, args...), strings.Join(h.log, "\n  "))
}
