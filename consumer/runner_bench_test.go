package consumer_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
)

// zipfStream returns n records over aggs aggregates, drawn from a Zipf
// distribution with exponent s (aggregate k with weight 1/(k+1)^s; at
// s=1.1 over 1,000 aggregates the hottest one has 18% of the records, and
// with the records of one aggregate applied one at a time, no concurrency
// runs faster than 1/0.18 = 5.6x one record at a time); s=0 draws them
// uniformly. Each aggregate's sequence counts up in order. The seed is
// fixed, so every run applies the same stream.
func zipfStream(n, aggs int, s float64) []*kgo.Record {
	r := rand.New(rand.NewSource(1))
	draw := func() int { return r.Intn(aggs) }
	if s > 0 {
		z := rand.NewZipf(r, s, 1, uint64(aggs-1))
		draw = func() int { return int(z.Uint64()) }
	}
	seqs := make([]int64, aggs)
	recs := make([]*kgo.Record, n)
	for i := range recs {
		a := draw()
		seqs[a]++
		agg := fmt.Sprintf("agg-%d", a)
		recs[i] = rec(agg, seqs[a], fmt.Sprintf("%s-%d", agg, seqs[a]))
	}
	return recs
}

// hottestShare returns the share of recs that its most frequent aggregate
// has.
func hottestShare(recs []*kgo.Record) float64 {
	counts := map[string]int{}
	top := 0
	for _, r := range recs {
		counts[string(r.Key)]++
		top = max(top, counts[string(r.Key)])
	}
	return float64(top) / float64(len(recs))
}

// runnerRig is what the runner benchmarks share: a database, a broker and
// a handler that inserts one row (or, as a BatchHandler, one multi-row
// INSERT per batch) into a table of the run's own, optionally waits, and
// notes when it handled the first and the last of the records it expects.
type runnerRig struct {
	db     *pgtest.DB
	broker *kafkatest.Broker
}

func newRunnerRig(b *testing.B, conns int32) *runnerRig {
	return &runnerRig{db: pgtest.New(b, &pgtest.Opts{MaxConns: conns}), broker: kafkatest.New(b)}
}

// benchRun is one configuration's run: its topic and effect table, and the
// times its handler saw.
type benchRun struct {
	rig   *runnerRig
	topic string
	table string
	want  int64
	count func(*consumer.Message) bool // which messages count towards want
	wait  func(*consumer.Message) time.Duration
	seen  atomic.Int64
	calls atomic.Int64 // handler calls: transactions, retries included
	// fetched, when set, counts what the runner's client decodes.
	fetched *fetchCount
	mu      sync.Mutex
	first   time.Time
	last    time.Time
	allIn   chan struct{}
	closed  sync.Once
}

// newRun makes a topic of partitions with recs (each to the partition
// part gives it) and a table for the run's effects.
func (rig *runnerRig) newRun(b *testing.B, partitions int32, recs []*kgo.Record, part func(*kgo.Record) int32) *benchRun {
	ctx := context.Background()
	r := &benchRun{rig: rig, topic: rig.broker.Topic(b, partitions), allIn: make(chan struct{})}
	r.table = rig.db.Table("run_" + r.topic[len("test-"):])
	_, err := rig.db.Pool.Exec(ctx, `CREATE TABLE `+r.table+` (n bigint GENERATED ALWAYS AS IDENTITY, key text NOT NULL, aggregate text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(b, err)
	cl := rig.broker.Client(b, kgo.DefaultProduceTopic(r.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(1<<20))
	for _, rec := range recs {
		rec.Partition = part(rec)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	require.NoError(b, cl.ProduceSync(pctx, recs...).FirstErr())
	cl.Close()
	r.count = func(*consumer.Message) bool { return true }
	r.wait = func(*consumer.Message) time.Duration { return 0 }
	r.want = int64(len(recs))
	return r
}

// handled notes that ms were handled.
func (r *benchRun) handled(ms ...*consumer.Message) {
	var n int64
	for _, m := range ms {
		if r.count(m) {
			n++
		}
	}
	r.handledN(n)
}

// handledN notes that n messages that count were handled.
func (r *benchRun) handledN(n int64) {
	if n == 0 {
		return
	}
	now := time.Now()
	total := r.seen.Add(n)
	r.mu.Lock()
	if r.first.IsZero() {
		r.first = now
	}
	r.last = now
	r.mu.Unlock()
	if total >= r.want {
		r.closed.Do(func() { close(r.allIn) })
	}
}

func (r *benchRun) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	r.calls.Add(1)
	if _, err := tx.Exec(ctx, `INSERT INTO `+r.table+` (key, aggregate, seq) VALUES ($1, $2, $3)`, m.IdempotencyKey, m.AggregateID, m.Seq); err != nil {
		return err
	}
	time.Sleep(r.wait(m))
	r.handled(m)
	return nil
}

// batchRun is a benchRun as a BatchHandler.
type batchRun struct{ *benchRun }

func (r batchRun) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	insert := multiRow{insertMany: `INSERT INTO ` + r.table + ` (key, aggregate, seq) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`}
	r.calls.Add(1)
	if err := insert.HandleBatch(ctx, tx, ms); err != nil {
		return err
	}
	r.handled(ms...)
	return nil
}

// rate returns the records/s that counted, from the first handled to the
// last: the group's join and the pool's first connections stay out.
func (r *benchRun) rate() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return float64(r.want) / r.last.Sub(r.first).Seconds()
}

// check fails b unless each of records was applied once and each
// aggregate's effects are in sequence order. The aggregate "slow" (see
// benchSlowPartition) is still being applied when the run stops, so its
// effects are checked for order only.
func (r *benchRun) check(b *testing.B, records int) {
	var rows, distinct, reordered int
	require.NoError(b, r.rig.db.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE aggregate <> 'slow'),
  count(DISTINCT key) FILTER (WHERE aggregate <> 'slow'),
  count(*) FILTER (WHERE seq <> coalesce(prev, 0) + 1)
FROM (SELECT key, aggregate, seq, lag(seq) OVER (PARTITION BY aggregate ORDER BY n) AS prev FROM `+r.table+`) x`).Scan(&rows, &distinct, &reordered))
	require.Equal(b, records, rows, "effects")
	require.Equal(b, records, distinct, "effects applied once")
	require.Zero(b, reordered, "effects out of sequence order")
}

// runner runs a Consumer with cfg over the run's topic until every record
// that counts was handled, then stops it and checks the effects.
func (r *benchRun) runner(b *testing.B, cfg consumer.Config, batchHandler bool, records int) float64 {
	cfg.Schema, cfg.Logger = r.rig.db.Schema, quietLogger
	opts := []kgo.Opt{
		kgo.ConsumerGroup("g-" + r.topic), kgo.ConsumeTopics(r.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond),
	}
	if r.fetched != nil {
		opts = append(opts, kgo.WithHooks(r.fetched))
	}
	cl := r.rig.broker.Client(b, append(opts, consumer.ClientOpts()...)...)
	var h consumer.Handler = r
	if batchHandler {
		h = batchRun{r}
	}
	c, err := consumer.New(r.rig.db.Pool, cl, "svc-"+r.topic, h, &cfg)
	require.NoError(b, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	r.await(b)
	stop()
	require.NoError(b, <-done)
	cl.Close()
	r.check(b, records)
	return r.rate()
}

// await waits for every record that counts to be handled.
func (r *benchRun) await(b *testing.B) {
	select {
	case <-r.allIn:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d records handled within 5 minutes", r.seen.Load(), r.want)
	}
}

// byKey returns a partitioner over n partitions by the record key's hash.
func byKey(n uint32) func(*kgo.Record) int32 {
	return func(r *kgo.Record) int32 {
		h := fnv.New32a()
		h.Write(r.Key)
		return int32(h.Sum32() % n)
	}
}

// BenchmarkRunner measures the runner (consumer.New and Run, kfake and
// PostgreSQL on the same machine) in the configurations the lanes and
// Config.Concurrency are for, each configuration run after the other on
// the same records in one run, and reports records/s and the same-run
// ratios. Keys are skewed: 1,000 aggregates drawn from Zipf s=1.1 (the
// hottest has 18% of the records), since all-distinct keys would measure
// unordered processing. Every run checks its own effects: each record
// applied once, each aggregate's in sequence order. The runner against the
// SDK's own loop is BenchmarkRunnerVersusProcess.
//
//	go test -run '^$' -bench 'Runner$' -benchtime 1x ./consumer
func BenchmarkRunner(b *testing.B) {
	b.Run("slow-handler", benchSlowHandler)
	b.Run("plain-handler", benchPlainHandler)
	b.Run("slow-partition", benchSlowPartition)
}

// One partition, a handler that inserts its row and then waits 2ms (an
// external call): Concurrency 32 against 1, with the skewed keys and, for
// reference, uniform ones.
func benchSlowHandler(b *testing.B) {
	for b.Loop() {
		rig := newRunnerRig(b, 40)
		one := func(*kgo.Record) int32 { return 0 }
		rates := map[string]float64{}
		for _, keys := range []struct {
			name string
			s    float64
		}{{"zipf", 1.1}, {"uniform", 0}} {
			b.Logf("%s: hottest aggregate has %.1f%% of the records", keys.name, 100*hottestShare(zipfStream(1500, 1000, keys.s)))
			for _, c := range []int{1, 32} {
				r := rig.newRun(b, 1, zipfStream(1500, 1000, keys.s), one)
				r.wait = func(*consumer.Message) time.Duration { return 2 * time.Millisecond }
				rates[fmt.Sprintf("%s-c%d", keys.name, c)] = r.runner(b, consumer.Config{Concurrency: c}, false, 1500)
			}
		}
		for k, v := range rates {
			b.ReportMetric(v, k+"-rec/s")
		}
		b.ReportMetric(rates["zipf-c32"]/rates["zipf-c1"], "zipf-c32/c1")
		b.ReportMetric(rates["uniform-c32"]/rates["uniform-c1"], "uniform-c32/c1")
	}
}

// One partition, the plain one-row handler: Concurrency 16 against 1 (and,
// for reference, the same with uniform keys), and batches of 100 with and
// without Concurrency 16.
func benchPlainHandler(b *testing.B) {
	for b.Loop() {
		rig := newRunnerRig(b, 24)
		one := func(*kgo.Record) int32 { return 0 }
		const n = 6000
		rates := map[string]float64{}
		for _, cfg := range []struct {
			name string
			s    float64
			cfg  consumer.Config
		}{
			{"c1", 1.1, consumer.Config{}},
			{"c16", 1.1, consumer.Config{Concurrency: 16}},
			{"batch-c1", 1.1, consumer.Config{BatchSize: 100}},
			{"batch-c16", 1.1, consumer.Config{BatchSize: 100, Concurrency: 16}},
			{"uniform-c1", 0, consumer.Config{}},
			{"uniform-c16", 0, consumer.Config{Concurrency: 16}},
		} {
			r := rig.newRun(b, 1, zipfStream(n, 1000, cfg.s), one)
			rates[cfg.name] = r.runner(b, cfg.cfg, false, n)
		}
		for k, v := range rates {
			b.ReportMetric(v, k+"-rec/s")
		}
		b.ReportMetric(rates["c16"]/rates["c1"], "c16/c1")
		b.ReportMetric(rates["uniform-c16"]/rates["uniform-c1"], "uniform-c16/c1")
		b.ReportMetric(rates["batch-c16"]/rates["batch-c1"], "batch-c16/batch-c1")
	}
}

// Four partitions, one of them with a handler that waits 200ms per record:
// the other three's records/s with the slow one against without it (its
// records then absent).
func benchSlowPartition(b *testing.B) {
	for b.Loop() {
		rig := newRunnerRig(b, 16)
		const fast = 3000
		spread := byKey(3)
		isFast := func(m *consumer.Message) bool { return m.Partition != 3 }
		alone := rig.newRun(b, 4, zipfStream(fast, 1000, 1.1), spread)
		without := alone.runner(b, consumer.Config{}, false, fast)

		recs := zipfStream(fast, 1000, 1.1)
		for _, r := range recs {
			r.Partition = spread(r)
		}
		var slow []*kgo.Record
		for seq := int64(1); seq <= 50; seq++ {
			r := rec("slow", seq, fmt.Sprintf("slow-%d", seq))
			r.Partition = 3
			slow = append(slow, r)
		}
		mixed := rig.newRun(b, 4, append(recs, slow...), func(r *kgo.Record) int32 { return r.Partition })
		mixed.count, mixed.want = isFast, fast
		mixed.wait = func(m *consumer.Message) time.Duration {
			if m.Partition == 3 {
				return 200 * time.Millisecond
			}
			return 0
		}
		cfg := consumer.Config{ShutdownGrace: time.Second}
		with := mixed.runner(b, cfg, false, fast)
		b.ReportMetric(without, "without-slow-rec/s")
		b.ReportMetric(with, "with-slow-rec/s")
		b.ReportMetric(with/without, "with/without")
	}
}
