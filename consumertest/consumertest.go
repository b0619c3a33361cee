package consumertest

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/ordering"
)

// Config says what to test and how to see its effects.
type Config struct {
	// DB is the database the handler writes to and the SDK's tables live
	// in. Either DB or DSN is required; DB wins when both are set.
	DB *pgxpool.Pool
	// DSN connects to that database when DB is nil; Run opens a pool and
	// closes it when done.
	DSN string
	// Schema holds the SDK's tables; Run migrates it with outbox.Migrate.
	// Default: a fresh schema named consumertest_<random>, dropped when
	// Run returns.
	Schema string

	// Handler is the handler under test. Required. When it also
	// implements consumer.BatchHandler, ProcessBatch applies batches
	// through HandleBatch, and Run checks that this changes nothing.
	Handler consumer.Handler
	// Records are sample records as your producer writes them, most
	// simply Records(events...), each aggregate's in sequence order
	// without a hole (an aggregate may start above 1: Run then skips the
	// earlier sequences as an operator would, with ResolveGap, or under
	// ordering.FirstSeenBaseline delivers that record first). Records
	// without a sequence header are fine. Each must carry an idempotency
	// key of its own (see consumer.Config.KeyFunc); Run delivers
	// duplicates itself. Check refuses records that break these rules
	// before it starts. Run copies them; Topic defaults to
	// "consumertest", and Partition and Offset are its own. Required.
	Records []*kgo.Record

	// Reset empties the tables the handler writes, before each schedule
	// and mode. Required: Run applies the records many times over.
	Reset func(ctx context.Context, db *pgxpool.Pool) error
	// Applied returns the idempotency keys (consumer.Message's
	// IdempotencyKey) of the effects in the database, in the order they
	// were applied (for example ORDER BY a serial column). Required.
	Applied func(ctx context.Context, db *pgxpool.Pool) ([]string, error)
	// State, when set, returns whatever else the handler's tables hold
	// that must not depend on how the records were delivered (balances,
	// totals, rows); Run compares it, with reflect.DeepEqual, between the
	// modes of one schedule. Default nil: only Applied is compared.
	State func(ctx context.Context, db *pgxpool.Pool) (any, error)

	// Consumer is the configuration to test with: KeyFunc, FirstSeen,
	// MaxValueBytes, MaxAttempts and HandlerTimeout are used as they are;
	// Schema is replaced by Run's, backoff bounds by 1-2 ms, and a nil
	// Logger discards. Default nil: the consumer's defaults.
	Consumer *consumer.Config
	// Runs is how many schedules to draw. Default 10;
	// OUTBOX_CONSUMERTEST_RUNS overrides it.
	Runs int
	// Seed is the first schedule's seed; schedule i uses Seed+i. Default:
	// random, unless OUTBOX_CONSUMERTEST_SEED is set.
	Seed uint64
}

// Failure is what Check returns when the handler fails a schedule: which
// one, in which mode, and what was wrong.
type Failure struct {
	// Seed is the schedule's seed: set OUTBOX_CONSUMERTEST_SEED to it (or
	// [Config.Seed]) to replay it as the first schedule.
	Seed uint64
	// Mode is "Process" (one record per transaction) or "ProcessBatch";
	// "both" when the two disagree.
	Mode string
	// Problem says what was wrong.
	Problem string
	// Schedule is what was delivered, step by step.
	Schedule []string
}

func (f *Failure) Error() string {
	return fmt.Sprintf("consumertest: %s: %s\nreproduce with OUTBOX_CONSUMERTEST_SEED=%d (or Config.Seed); the schedule:\n  %s",
		f.Mode, f.Problem, f.Seed, strings.Join(f.Schedule, "\n  "))
}

// Run runs Check with t's context and fails t with its error, which
// names the seed that reproduces it.
func Run(t testing.TB, cfg Config) {
	t.Helper()
	if err := Check(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
}

// Check replays cfg.Records through a consumer.Processor in [Config.Runs]
// schedules of redeliveries, producer duplicates, reorders, gaps,
// restarts with lost offsets, failed tries and dead letters replayed, each
// schedule once one record per transaction (Process) and once in batches
// (ProcessBatch), and returns a *Failure for the first schedule whose
// effects are not each applied once, in order, or differ between the two.
// Other errors mean the test could not run (a database failure, an
// invalid Config). It blocks until done or ctx ends.
func Check(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	var keyFunc func(*kgo.Record) (string, error)
	if cfg.Consumer != nil {
		keyFunc = cfg.Consumer.KeyFunc
	}
	samples, err := readSamples(cfg.Records, keyFunc)
	if err != nil {
		return err
	}
	pool := cfg.DB
	if pool == nil {
		if pool, err = pgxpool.New(ctx, cfg.DSN); err != nil {
			return fmt.Errorf("consumertest: connect: %w", err)
		}
		defer pool.Close()
	}
	schema := cfg.Schema
	if schema == "" {
		schema = "consumertest_" + randomHex(6)
		defer func() {
			_, _ = pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		}()
	}
	if _, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema, Logger: discard}); err != nil {
		return fmt.Errorf("consumertest: migrate schema %s: %w", schema, err)
	}
	logTable := pgx.Identifier{schema, "consumertest_log"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+logTable+` (
    n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, consumer text NOT NULL, key text NOT NULL,
    aggregate_type text NOT NULL, aggregate_id text NOT NULL, seq bigint NOT NULL, record_offset bigint NOT NULL)`); err != nil {
		return fmt.Errorf("consumertest: create log table: %w", err)
	}

	ccfg := consumer.Config{}
	if cfg.Consumer != nil {
		ccfg = *cfg.Consumer
	}
	ccfg.Schema, ccfg.MinBackoff, ccfg.MaxBackoff = schema, time.Millisecond, 2*time.Millisecond
	if ccfg.Logger == nil {
		ccfg.Logger = discard
	}
	if ccfg.MaxAttempts == 0 {
		ccfg.MaxAttempts = 5 // consumer's default
	}
	runs, seed, err := cfg.runsAndSeed()
	if err != nil {
		return err
	}
	h := &harness{cfg: &cfg, ccfg: ccfg, pool: pool, logTable: logTable, samples: samples, tag: randomHex(4)}
	if _, ok := cfg.Handler.(consumer.BatchHandler); ok {
		// Drawn schedules may roll every batch back to one record per
		// transaction; this one always runs HandleBatch to its commit.
		if err := h.check(ctx, seed, newSchedule(nil, samples, ccfg, true)); err != nil {
			return err
		}
	}
	for i := range runs {
		s := seed + uint64(i)
		sc := newSchedule(rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15)), samples, ccfg, false) //nolint:gosec // seeded so that a failure can be replayed
		if err := h.check(ctx, s, sc); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) validate() error {
	switch {
	case c.DB == nil && c.DSN == "":
		return errors.New("consumertest: Config needs DB or DSN")
	case c.Handler == nil:
		return errors.New("consumertest: Config needs the Handler to test")
	case len(c.Records) == 0:
		return errors.New("consumertest: Config needs sample Records")
	case c.Reset == nil:
		return errors.New("consumertest: Config needs Reset, to empty the handler's tables between schedules")
	case c.Applied == nil:
		return errors.New("consumertest: Config needs Applied, to report the idempotency keys of the effects in the database")
	case c.Runs < 0:
		return fmt.Errorf("consumertest: Runs %d is negative", c.Runs)
	}
	return nil
}

func (c *Config) runsAndSeed() (int, uint64, error) {
	runs, seed := c.Runs, c.Seed
	if runs == 0 {
		runs = 10
	}
	if v := os.Getenv("OUTBOX_CONSUMERTEST_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, 0, fmt.Errorf("consumertest: OUTBOX_CONSUMERTEST_RUNS=%q is not a positive number", v)
		}
		runs = n
	}
	if v := os.Getenv("OUTBOX_CONSUMERTEST_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("consumertest: OUTBOX_CONSUMERTEST_SEED=%q is not a number", v)
		}
		seed = n
	}
	if seed == 0 {
		var b [8]byte
		_, _ = crand.Read(b[:])
		seed = binary.LittleEndian.Uint64(b[:]) | 1
	}
	return runs, seed, nil
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

// harness runs schedules.
type harness struct {
	cfg      *Config
	ccfg     consumer.Config
	pool     *pgxpool.Pool
	logTable string
	samples  []sample
	// tag keeps this Check's consumer names apart from an earlier one's
	// in a schema that outlives it.
	tag string
}

// outcome is what one mode of a schedule left in the database.
type outcome struct {
	applied []string
	state   any
	// byKey is the SDK's account, from the log written in the handler's
	// transaction: which record each applied key came from.
	byKey map[string]logRow
}

type logRow struct {
	agg    ordering.Aggregate
	seq    int64
	sample int
}

func (h *harness) check(ctx context.Context, seed uint64, sc *schedule) error {
	fail := func(mode, format string, args ...any) error {
		return &Failure{Seed: seed, Mode: mode, Problem: fmt.Sprintf(format, args...), Schedule: sc.steps}
	}
	var outs []*outcome
	for _, mode := range []string{"Process", "ProcessBatch"} {
		out, problem, err := h.runMode(ctx, seed, sc, mode)
		if err != nil {
			return err
		}
		if problem != "" {
			return fail(mode, "%s", problem)
		}
		if problem := h.judge(out); problem != "" {
			return fail(mode, "%s", problem)
		}
		outs = append(outs, out)
	}
	a, b := perAggregate(outs[0]), perAggregate(outs[1])
	if !reflect.DeepEqual(a, b) {
		return fail("both", "Process applied %v, ProcessBatch %v: %s", a, b, h.sameEffect())
	}
	if h.cfg.State != nil && !reflect.DeepEqual(outs[0].state, outs[1].state) {
		return fail("both", "State after Process is %#v, after ProcessBatch %#v: %s", outs[0].state, outs[1].state, h.sameEffect())
	}
	return nil
}

// sameEffect says what a handler of the kind under test must do for
// Process and ProcessBatch to agree.
func (h *harness) sameEffect() string {
	if _, ok := h.cfg.Handler.(consumer.BatchHandler); ok {
		return "with a BatchHandler, HandleBatch must have exactly the effect of Handle for each message"
	}
	return "ProcessBatch calls Handle for several messages in one transaction, so Handle's effect must not depend on what else its transaction did (rows it wrote for earlier messages, the transaction id, state kept per transaction)"
}

// judge says what is wrong with one mode's outcome, or "".
func (h *harness) judge(out *outcome) string {
	count := map[string]int{}
	for _, k := range out.applied {
		count[k]++
	}
	for _, k := range out.applied {
		n := count[k]
		if _, ok := out.byKey[k]; !ok {
			return fmt.Sprintf("Applied lists %q, which no record applied carries as its idempotency key", k)
		}
		if n > 1 {
			r := out.byKey[k]
			return fmt.Sprintf("the effect of %q (record %d, %s seq %d) is applied %d times: does the handler write outside the transaction it is given, or keep state across tries?", k, r.sample, r.agg, r.seq, n)
		}
	}
	keys := slices.Sorted(mapKeys(out.byKey))
	for _, k := range keys {
		if count[k] == 0 {
			r := out.byKey[k]
			return fmt.Sprintf("the effect of %q (record %d, %s seq %d) is missing from Applied, although its transaction committed", k, r.sample, r.agg, r.seq)
		}
	}
	seen := map[int]bool{}
	for _, r := range out.byKey {
		seen[r.sample] = true
	}
	for i := range h.samples {
		if !seen[i] {
			return fmt.Sprintf("record %d (key %q) was never applied, and is neither dead-lettered nor parked: did the handler return nil without writing its effect?", i, h.samples[i].key)
		}
	}
	last := map[ordering.Aggregate]int64{}
	for _, k := range out.applied {
		r := out.byKey[k]
		if r.seq == 0 {
			continue
		}
		if r.seq <= last[r.agg] {
			return fmt.Sprintf("Applied lists %s seq %d after seq %d: effects out of sequence order", r.agg, r.seq, last[r.agg])
		}
		last[r.agg] = r.seq
	}
	return ""
}

func perAggregate(out *outcome) map[ordering.Aggregate][]string {
	m := map[ordering.Aggregate][]string{}
	for _, k := range out.applied {
		r := out.byKey[k]
		m[r.agg] = append(m[r.agg], k)
	}
	return m
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// runMode runs sc in one mode and returns its outcome, or a problem with
// the handler, or an error that stopped the test.
func (h *harness) runMode(ctx context.Context, seed uint64, sc *schedule, mode string) (*outcome, string, error) {
	if err := h.cfg.Reset(ctx, h.pool); err != nil {
		return nil, "", fmt.Errorf("consumertest: Reset: %w", err)
	}
	name := fmt.Sprintf("consumertest-%s-%d-%s", h.tag, seed, mode)
	if sc.plain {
		name += "-plain"
	}
	w := &wrapper{user: h.cfg.Handler, name: name, logTable: h.logTable, n: len(h.samples), faults: sc.faults, calls: map[int]int{}}
	var hd consumer.Handler = w
	if bh, ok := h.cfg.Handler.(consumer.BatchHandler); ok {
		hd = batchWrapper{w, bh}
	}
	start := func() (*consumer.Processor, error) {
		p, err := consumer.Handle(h.pool, name, hd, &h.ccfg)
		if err != nil {
			return nil, fmt.Errorf("consumertest: %w", err)
		}
		return p, nil
	}
	p, err := start()
	if err != nil {
		return nil, "", err
	}
	var (
		pending []int
		last    []int
		backs   int
	)
	deliver := func(idx []int) (string, error) {
		recs := make([]*kgo.Record, len(idx))
		for i, x := range idx {
			recs[i] = h.record(x)
		}
		done := 0
		var perr error
		if mode == "Process" {
			for _, r := range recs {
				if _, perr = p.Process(ctx, r); perr != nil {
					break
				}
				done++
			}
		} else {
			var res []consumer.Result
			res, perr = p.ProcessBatch(ctx, recs)
			done = len(res)
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		pending = idx[done:]
		if perr != nil {
			if backs++; backs > 50 {
				return fmt.Sprintf("records keep being handed back undone: %v", perr), nil
			}
		}
		return "", nil
	}
	for _, st := range sc.plan {
		switch {
		case st.restart:
			if p, err = start(); err != nil {
				return nil, "", err
			}
			if st.lostOffsets && len(last) > 0 {
				pending = slices.Clone(last)
			}
		case st.resolve != nil:
			// An operator retries a drain that a transient failure undid.
			var err error
			for range 2 * h.ccfg.MaxAttempts {
				if _, err = p.ResolveGap(ctx, *st.resolve); err == nil {
					break
				}
			}
			if err != nil {
				return nil, fmt.Sprintf("ResolveGap(%s) to start the aggregate: %v", *st.resolve, err), nil
			}
		default:
			last = append(slices.Clone(pending), st.poll...)
			if problem, err := deliver(last); problem != "" || err != nil {
				return nil, problem, err
			}
		}
	}
	// The fix is deployed: poisoned records succeed from now on.
	w.heal()
	for len(pending) > 0 {
		if problem, err := deliver(pending); problem != "" || err != nil {
			return nil, problem, err
		}
	}
	in, open := p.Inspector(), &deadletter.ListOpts{Consumer: p.Name(), Status: deadletter.StatusDead}
	for range 10 {
		letters, err := in.Letters(ctx, open)
		if err != nil {
			return nil, "", fmt.Errorf("consumertest: list dead letters: %w", err)
		}
		if len(letters) == 0 {
			break
		}
		for _, l := range letters {
			_, _ = p.Replay(ctx, l.ID)
		}
	}
	letters, err := in.Letters(ctx, open)
	if err != nil {
		return nil, "", fmt.Errorf("consumertest: list dead letters: %w", err)
	}
	if len(letters) > 0 {
		l := letters[0]
		_, rerr := p.Replay(ctx, l.ID)
		return nil, fmt.Sprintf("record %d is still dead-lettered after its replay: %s (replay: %v)", w.sample(l.Record.Offset), l.Error, rerr), nil
	}
	gaps, err := in.Gaps(ctx, &ordering.GapOpts{Consumer: p.Name(), Limit: 1})
	if err != nil {
		return nil, "", fmt.Errorf("consumertest: gaps: %w", err)
	}
	if len(gaps.Gaps) > 0 {
		g := gaps.Gaps[0]
		return nil, fmt.Sprintf("%d records of %s are still parked, waiting for seq %d, after every record was delivered: are the sample's sequences of it without a hole?", g.Parked, g.Aggregate, g.Expected), nil
	}

	out := &outcome{byKey: map[string]logRow{}}
	if out.applied, err = h.cfg.Applied(ctx, h.pool); err != nil {
		return nil, "", fmt.Errorf("consumertest: Applied: %w", err)
	}
	if h.cfg.State != nil {
		if out.state, err = h.cfg.State(ctx, h.pool); err != nil {
			return nil, "", fmt.Errorf("consumertest: State: %w", err)
		}
	}
	rows, err := h.pool.Query(ctx, `SELECT key, aggregate_type, aggregate_id, seq, record_offset FROM `+h.logTable+` WHERE consumer = $1 ORDER BY n`, name)
	if err != nil {
		return nil, "", fmt.Errorf("consumertest: read log: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k   string
			r   logRow
			off int64
		)
		if err := rows.Scan(&k, &r.agg.Type, &r.agg.ID, &r.seq, &off); err != nil {
			return nil, "", fmt.Errorf("consumertest: read log: %w", err)
		}
		if prev, twice := out.byKey[k]; twice {
			// The SDK's own guarantee, seen from inside the transaction.
			return nil, fmt.Sprintf("the SDK committed %q twice (records %d and %d): please report this", k, prev.sample, w.sample(off)), nil
		}
		r.sample = w.sample(off)
		out.byKey[k] = r
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("consumertest: read log: %w", err)
	}
	return out, "", nil
}

// record returns a copy of the sample that x (a sample index plus a copy
// number times len(samples)) delivers, at offset x+1: the same x is a
// redelivery, another copy of a sample a producer's duplicate.
func (h *harness) record(x int) *kgo.Record {
	r := *h.cfg.Records[x%len(h.samples)]
	r.Headers = slices.Clone(r.Headers)
	if r.Topic == "" {
		r.Topic = "consumertest"
	}
	r.Partition, r.Offset = 0, int64(x)+1
	return &r
}

// faultKind is how a try fails after the handler ran.
type faultKind int

const (
	faultError     faultKind = iota // a plain error
	faultPanic                      // a panic
	faultTransient                  // a serialization failure (SQLSTATE 40001) from the server
	faultPoison                     // a plain error on every try until the end of the schedule
)

func (k faultKind) String() string {
	return [...]string{"error", "panic", "serialization failure", "poison"}[k]
}

type fault struct {
	kind  faultKind
	tries int // how many tries fail; poison: all until healed
}

var errInjected = errors.New("consumertest: injected failure after the handler ran")

// wrapper runs the user's handler, logs what it applied in the same
// transaction, and then fails the try when the schedule says so, so that
// the transaction, with the handler's work, is rolled back.
type wrapper struct {
	user     consumer.Handler
	name     string
	logTable string
	n        int
	faults   map[int]fault

	mu     sync.Mutex
	calls  map[int]int
	healed bool
}

func (w *wrapper) sample(offset int64) int { return int(offset-1) % w.n }

func (w *wrapper) heal() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.healed = true
}

func (w *wrapper) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if err := w.user.Handle(ctx, tx, m); err != nil {
		return err
	}
	return w.after(ctx, tx, []*consumer.Message{m})
}

func (w *wrapper) after(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	keys, types, ids := make([]string, len(ms)), make([]string, len(ms)), make([]string, len(ms))
	seqs, offs := make([]int64, len(ms)), make([]int64, len(ms))
	for i, m := range ms {
		keys[i], types[i], ids[i], seqs[i], offs[i] = m.IdempotencyKey, m.AggregateType, m.AggregateID, m.Seq, m.Offset
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+w.logTable+` (consumer, key, aggregate_type, aggregate_id, seq, record_offset)
SELECT $1, k, t, i, s, o FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[]) WITH ORDINALITY AS u (k, t, i, s, o, n) ORDER BY n`,
		w.name, keys, types, ids, seqs, offs); err != nil {
		return fmt.Errorf("consumertest: log applied message: %w", err)
	}
	for _, m := range ms {
		if err := w.fail(ctx, tx, m); err != nil {
			return err
		}
	}
	return nil
}

// fail fails m's try when its fault says so.
func (w *wrapper) fail(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	x := w.sample(m.Offset)
	w.mu.Lock()
	f, ok := w.faults[x]
	due := ok && (f.kind == faultPoison && !w.healed || f.kind != faultPoison && w.calls[x] < f.tries)
	if due {
		w.calls[x]++
	}
	w.mu.Unlock()
	if !due {
		return nil
	}
	switch f.kind {
	case faultPanic:
		panic(errInjected)
	case faultTransient:
		_, err := tx.Exec(ctx, `DO $$BEGIN RAISE EXCEPTION 'consumertest: injected serialization failure' USING ERRCODE = '40001'; END$$`)
		if err == nil {
			err = errInjected
		}
		return err
	}
	return errInjected
}

// batchWrapper is wrapper for a BatchHandler.
type batchWrapper struct {
	*wrapper
	bh consumer.BatchHandler
}

func (w batchWrapper) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	if err := w.bh.HandleBatch(ctx, tx, ms); err != nil {
		return err
	}
	return w.after(ctx, tx, ms)
}
