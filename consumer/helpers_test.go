package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/ordering"
)

// nextOffset gives every test record its own offset, as a partition would.
var nextOffset atomic.Int64

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// mode is one way of running a scenario.
type mode struct {
	name  string
	batch int
	// batchHandler gives the processor the effects as a BatchHandler, so
	// that a batch's happy path calls HandleBatch instead of Handle.
	batchHandler bool
	// concurrency is the runner's Config.Concurrency; 0 leaves the default.
	concurrency int
}

// modes runs a scenario with one record per transaction, in batches through
// Handle, and in batches through HandleBatch.
var modes = []mode{{"Single", 1, false, 0}, {"Batch", 50, false, 0}, {"BatchHandler", 50, true, 0}}

// runnerModes are the modes for the runner: each of modes at Concurrency 1
// and at 16.
var runnerModes = func() []mode {
	var out []mode
	for _, c := range []int{1, 16} {
		for _, md := range modes {
			md.name, md.concurrency = fmt.Sprintf("%sC%d", md.name, c), c
			out = append(out, md)
		}
	}
	return out
}()

// config returns fastConfig for md.
func (md mode) config(db *pgtest.DB) *consumer.Config {
	cfg := fastConfig(db, md.batch)
	cfg.Concurrency = md.concurrency
	return cfg
}

// handler returns e as the handler of md.
func (md mode) handler(e *effects) consumer.Handler {
	if md.batchHandler {
		return batchEffects{e}
	}
	return e
}

// rec builds a record of the wire contract: aggregate "order"/agg at seq
// (no sequence header when seq is 0), keyed by key.
func rec(agg string, seq int64, key string) *kgo.Record {
	r := &kgo.Record{Key: []byte(agg), Value: []byte(fmt.Sprintf(`{"agg":%q,"seq":%d}`, agg, seq))}
	r.Headers = append(r.Headers,
		kgo.RecordHeader{Key: outbox.HeaderEventID, Value: []byte(key)},
		kgo.RecordHeader{Key: outbox.HeaderEventType, Value: []byte("order.changed")},
		kgo.RecordHeader{Key: outbox.HeaderAggregateType, Value: []byte("order")},
		kgo.RecordHeader{Key: outbox.HeaderAggregateID, Value: []byte(agg)},
	)
	if seq > 0 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderAggregateSeq, Value: []byte(strconv.FormatInt(seq, 10))})
	}
	return r
}

// effects is a handler that inserts one row per applied message into the
// test's effects table, and fails on demand.
type effects struct {
	db    *pgtest.DB
	table string

	// reject, when set before the handler runs, is one more reason to
	// fail: the error it returns for a message.
	reject func(*consumer.Message) error

	mu sync.Mutex
	// fail makes the handler fail for these aggregates.
	fail map[string]error
	// panicOn makes the handler panic for these aggregates.
	panicOn map[string]bool
	// calls counts Handle's runs per key; batches holds HandleBatch's
	// messages, one slice per call.
	calls   map[string]int
	batches [][]*consumer.Message
}

func newEffects(t *testing.T, db *pgtest.DB) *effects {
	t.Helper()
	e := &effects{db: db, table: db.Table("effects"), fail: map[string]error{}, panicOn: map[string]bool{}, calls: map[string]int{}}
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+e.table+` (
		n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key text NOT NULL, aggregate text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(t, err)
	return e
}

func (e *effects) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	e.mu.Lock()
	e.calls[m.IdempotencyKey]++
	e.mu.Unlock()
	if err := e.failure(m); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+e.table+` (key, aggregate, seq) VALUES ($1, $2, $3)`, m.IdempotencyKey, m.AggregateID, m.Seq)
	return err
}

// failure returns the error the handler is to fail with for m, or panics
// when it is to panic.
func (e *effects) failure(m *consumer.Message) error {
	e.mu.Lock()
	err, pn := e.fail[m.AggregateID], e.panicOn[m.AggregateID]
	if kerr := e.fail["key:"+m.IdempotencyKey]; kerr != nil {
		err = kerr
	}
	e.mu.Unlock()
	if pn {
		panic("handler bug for " + m.AggregateID)
	}
	if err == nil && e.reject != nil {
		err = e.reject(m)
	}
	return err
}

// batchEffects is effects as a BatchHandler: one multi-row INSERT for the
// whole batch, then the failures Handle would have had. It writes before it
// fails, so that a batch that is not rolled back shows up as doubled rows.
type batchEffects struct{ *effects }

func (e batchEffects) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	e.mu.Lock()
	e.batches = append(e.batches, slices.Clone(ms))
	e.mu.Unlock()
	keys, aggs, seqs := make([]string, len(ms)), make([]string, len(ms)), make([]int64, len(ms))
	for i, m := range ms {
		keys[i], aggs[i], seqs[i] = m.IdempotencyKey, m.AggregateID, m.Seq
	}
	// ORDER BY keeps the identity column in the order of ms, as Handle
	// for each would have.
	_, err := tx.Exec(ctx, `INSERT INTO `+e.table+` (key, aggregate, seq)
SELECT k, a, s FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS u (k, a, s, o) ORDER BY o`, keys, aggs, seqs)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := e.failure(m); err != nil {
			return err
		}
	}
	return nil
}

// batchKeys returns the keys HandleBatch was given, one slice per call.
func (e *effects) batchKeys() [][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([][]string, len(e.batches))
	for i, ms := range e.batches {
		for _, m := range ms {
			out[i] = append(out[i], m.IdempotencyKey)
		}
	}
	return out
}

// handleCalls counts Handle's runs, over all keys.
func (e *effects) handleCalls() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, c := range e.calls {
		n += c
	}
	return n
}

func (e *effects) setFail(agg string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err == nil {
		delete(e.fail, agg)
	} else {
		e.fail[agg] = err
	}
}

func (e *effects) callsOf(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[key]
}

// seqs returns the applied sequences of agg in the order they were applied.
func (e *effects) seqs(t *testing.T, agg string) []int64 {
	return appliedColumn[int64](t, e, "seq", agg)
}

// keys returns the keys of agg's effects in the order they were applied.
func (e *effects) keys(t *testing.T, agg string) []string {
	return appliedColumn[string](t, e, "key", agg)
}

// appliedColumn returns column of agg's effect rows in the order they were
// applied.
func appliedColumn[T any](t *testing.T, e *effects, column, agg string) []T {
	t.Helper()
	rows, err := e.db.Pool.Query(context.Background(), `SELECT `+column+` FROM `+e.table+` WHERE aggregate = $1 ORDER BY n`, agg)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[T])
	require.NoError(t, err)
	return out
}

// count returns how many effect rows there are and how many distinct keys.
func (e *effects) count(t *testing.T) (rows, distinct int) {
	t.Helper()
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT key) FROM `+e.table).Scan(&rows, &distinct))
	return rows, distinct
}

var errBroken = errors.New("downstream broken")

func fastConfig(db *pgtest.DB, batch int) *consumer.Config {
	return &consumer.Config{
		Schema: db.Schema, MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		BatchSize: batch, Logger: quietLogger, ContentionSpan: -1,
	}
}

// processAll feeds recs to p as one partition would: one by one, or in
// chunks of batch.
func processAll(t *testing.T, p *consumer.Processor, batch int, recs ...*kgo.Record) []consumer.Result {
	t.Helper()
	ctx := context.Background()
	var out []consumer.Result
	for _, r := range recs {
		r.Offset = nextOffset.Add(1)
		if r.Topic == "" {
			r.Topic = "orders"
		}
	}
	for len(recs) > 0 {
		n := min(batch, len(recs))
		if n == 1 {
			res, err := p.Process(ctx, recs[0])
			require.NoError(t, err)
			out = append(out, res)
		} else {
			res, err := p.ProcessBatch(ctx, recs[:n])
			require.NoError(t, err)
			require.Len(t, res, n)
			out = append(out, res...)
		}
		recs = recs[n:]
	}
	return out
}

func outcomes(rs []consumer.Result) []consumer.Outcome {
	out := make([]consumer.Outcome, len(rs))
	for i, r := range rs {
		out[i] = r.Outcome
	}
	return out
}

func (e *effects) failKey(key string, err error) { e.setFail("key:"+key, err) }

type pgxTx = pgx.Tx

// fakeBeginner is a database for tests that never reach it.
func strconvI(i int64) string { return strconv.FormatInt(i, 10) }

// lockedBuffer collects a logger's text output, for tests that read it
// while the code under test writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// lines returns the logged lines that contain all of parts.
func (l *lockedBuffer) lines(parts ...string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		all := line != ""
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			out = append(out, line)
		}
	}
	return out
}

// allGaps reads every page of p's gaps through its Inspector.
func allGaps(ctx context.Context, p *consumer.Processor) ([]ordering.OpenGap, error) {
	var (
		out  []ordering.OpenGap
		opts = ordering.GapOpts{Consumer: p.Name()}
	)
	for {
		page, err := p.Inspector().Gaps(ctx, &opts)
		if err != nil {
			return nil, err
		}
		out = append(out, page.Gaps...)
		if page.Next == nil {
			return out, nil
		}
		opts.After = page.Next
	}
}

// lettersOf lists p's dead letters that opts (nil: all) matches through
// its Inspector.
func lettersOf(ctx context.Context, p *consumer.Processor, opts *deadletter.ListOpts) ([]*deadletter.Letter, error) {
	o := deadletter.ListOpts{}
	if opts != nil {
		o = *opts
	}
	o.Consumer = p.Name()
	return p.Inspector().Letters(ctx, &o)
}

// mustInspector returns the Inspector of schema in db.
func mustInspector(t *testing.T, db outbox.DB, schema string) *consumer.Inspector {
	t.Helper()
	in, err := consumer.NewInspector(db, schema)
	require.NoError(t, err)
	return in
}
