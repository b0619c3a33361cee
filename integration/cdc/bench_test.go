package cdc_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pacedwrite"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// BenchmarkDispatch compares CDC with the relay in one run, on the same
// broker, database and machine, the modes taking turns:
//
//   - commit-to-handler latency (p50, p99) at 300 and 1,000 events/s: one
//     event per transaction, written with pacedwrite after a second of
//     warm-up, applied by the SDK's consumer; the clock runs from the
//     writer's commit returning to the handler being called;
//
//   - drain throughput: 20,000 events written while nothing publishes,
//     then the relay started or the paused connector resumed; events/s
//     until all of them are on the topic;
//
//   - the Connect worker's JVM: start time (connect.sh start, to the REST
//     API answering with the Debezium plugin loaded) and resident memory
//     (VmRSS, and VmHWM, its peak) after the runs, when CONNECT_SCRIPT is
//     given.
//
// Run it with KAFKA_BROKERS, CONNECT_URL and CONNECT_SCRIPT set as for the
// tests (.ci/run does, after them):
//
//	go test -run '^$' -bench Dispatch -benchtime 1x ./integration/cdc
func BenchmarkDispatch(b *testing.B) {
	for range b.N {
		w := need(b)
		if w.script != "" {
			// connect.sh says how long the start took: from launching
			// the JVM to the REST API answering with the plugin loaded.
			w.worker(b, "stop")
			_, out := w.worker(b, "restart")
			m := readyIn.FindStringSubmatch(out)
			require.NotNil(b, m, "connect.sh did not say how long the start took: %s", out)
			ms, _ := strconv.Atoi(m[1])
			b.ReportMetric(float64(ms), "jvm-start-ms")
		}
		for _, rate := range []int{300, 1000} {
			for _, mode := range []string{"relay", "cdc"} {
				p50, p99 := latency(b, w, mode, rate)
				b.ReportMetric(float64(p50.Microseconds())/1000, fmt.Sprintf("%s-%d/s-p50-ms", mode, rate))
				b.ReportMetric(float64(p99.Microseconds())/1000, fmt.Sprintf("%s-%d/s-p99-ms", mode, rate))
			}
		}
		for _, mode := range []string{"relay", "cdc"} {
			b.ReportMetric(drain(b, w, mode, 20000), mode+"-drain-ev/s")
		}
		if rss, hwm, ok := w.jvmMemory(); ok {
			b.ReportMetric(float64(rss)/1024, "jvm-rss-MiB")
			b.ReportMetric(float64(hwm)/1024, "jvm-peak-rss-MiB")
		}
		b.ReportMetric(0, "ns/op")
	}
}

// readyIn finds connect.sh's start time in its output.
var readyIn = regexp.MustCompile(`ready on \S+ in (\d+) ms`)

// dispatcher is what publishes a benchmark schema: a relay or a connector.
type dispatcher struct {
	start, stop func()
}

// setupMode gives a benchmark run a schema, a topic and a dispatcher of the
// mode, not started, and the writer to write with.
func setupMode(b *testing.B, w *world, mode string) (*pgtest.DB, string, *producer.Writer, dispatcher) {
	b.Helper()
	if mode == "cdc" {
		c := newCDC(b, w, 4, &pgtest.Opts{MaxConns: 40})
		// newCDC leaves the connector streaming: pause it until the
		// benchmark starts it.
		c.pause(b)
		return c.db, c.topic, c.writer, dispatcher{start: func() { c.resume(b) }, stop: func() { c.pause(b) }}
	}
	db := pgtest.New(b, &pgtest.Opts{MaxConns: 40})
	topic := topic(b, w.broker, 4)
	pool, err := pgxpool.New(context.Background(), db.Server.URL)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	relay, err := producer.NewRelay(pool, w.broker.Client(b), &producer.RelayConfig{Schema: db.Schema, Topic: topic, Logger: quiet})
	require.NoError(b, err)
	var (
		cancel func()
		done   chan error
	)
	d := dispatcher{
		start: func() {
			ctx, c := context.WithCancel(context.Background())
			cancel, done = c, make(chan error, 1)
			go func() { done <- relay.Run(ctx) }()
		},
		stop: func() {
			if cancel != nil {
				cancel()
				<-done
				cancel = nil
			}
		},
	}
	b.Cleanup(d.stop)
	return db, topic, producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}), d
}

// latency writes at rate for five seconds and returns the commit-to-handler
// percentiles.
func latency(b *testing.B, w *world, mode string, rate int) (p50, p99 time.Duration) {
	b.Helper()
	db, topic, writer, d := setupMode(b, w, mode)
	d.start()
	defer d.stop()
	var (
		mu      sync.Mutex
		arrived = map[string]time.Time{}
		count   atomic.Int64
	)
	h := consumer.HandlerFunc(func(_ context.Context, _ pgx.Tx, m *consumer.Message) error {
		at := time.Now()
		mu.Lock()
		if _, ok := arrived[m.EventID]; !ok {
			arrived[m.EventID] = at
			count.Add(1)
		}
		mu.Unlock()
		return nil
	})
	stop := runConsumer(b, db, w, topic, h)
	defer stop()
	pool, err := pgxpool.New(context.Background(), db.Server.URL)
	require.NoError(b, err)
	defer pool.Close()
	total := 5 * rate
	committed := pacedwrite.Run(context.Background(), b, pool, writer, rate, total, func() int { return int(count.Load()) })
	eventually.True(b, 2*time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for id := range committed {
			if _, ok := arrived[id]; ok {
				n++
			}
		}
		return n == len(committed)
	}, "every measured event handled")
	mu.Lock()
	defer mu.Unlock()
	p50, p99 = pacedwrite.Percentiles(committed, arrived)
	b.Logf("%s at %d events/s: commit-to-handler p50 %s, p99 %s over %d events", mode, rate, p50, p99, len(committed))
	return p50, p99
}

// drain writes n events with nothing publishing, then starts the
// dispatcher and returns the events per second until all are on the topic.
func drain(b *testing.B, w *world, mode string, n int) float64 {
	b.Helper()
	db, topic, writer, d := setupMode(b, w, mode)
	ctx := context.Background()
	const perTx = 500
	for i := 0; i < n; i += perTx {
		events := make([]producer.Event, perTx)
		for j := range events {
			events[j] = producer.Event{AggregateType: "account", AggregateID: strconv.Itoa((i + j) % 500), EventType: "e", Payload: []byte("x")}
		}
		require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := writer.Write(ctx, tx, events...)
			return err
		}))
	}
	cl := w.broker.Client(b, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	start := time.Now()
	d.start()
	defer d.stop()
	got := 0
	pctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for got < n {
		fetches := cl.PollFetches(pctx)
		require.NoError(b, pctx.Err(), "%d of %d events on the topic", got, n)
		got += fetches.NumRecords()
	}
	took := time.Since(start)
	rate := float64(n) / took.Seconds()
	b.Logf("%s drained %d events in %s: %.0f events/s", mode, n, took.Round(time.Millisecond), rate)
	return rate
}

// runConsumer runs a group consumer of topic with h until stop.
func runConsumer(tb testing.TB, db *pgtest.DB, w *world, topic string, h consumer.Handler) (stop func()) {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), db.Server.URL)
	require.NoError(tb, err)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(w.broker.Addrs...), kgo.ConsumerGroup("g-" + topic),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(10 * time.Millisecond)},
		consumer.ClientOpts()...)...)
	require.NoError(tb, err)
	c, err := consumer.New(pool, cl, "bench", h, &consumer.Config{Schema: db.Schema, Logger: quiet, Concurrency: 16})
	require.NoError(tb, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return onceFunc(func() {
		cancel()
		<-done
		cl.Close()
		pool.Close()
	})
}

// pause pauses the connector and waits until its task says so.
func (c *cdc) pause(tb testing.TB) { c.setPaused(tb, true) }

// resume resumes the connector and waits until its task runs.
func (c *cdc) resume(tb testing.TB) { c.setPaused(tb, false) }

func (c *cdc) setPaused(tb testing.TB, paused bool) {
	tb.Helper()
	verb, want := "resume", "RUNNING,RUNNING"
	if paused {
		verb, want = "pause", "PAUSED,PAUSED"
	}
	status, out := c.w.rest(tb, http.MethodPut, "/connectors/"+c.name+"/"+verb, nil)
	require.Equal(tb, http.StatusAccepted, status, "%s connector %s: %s", verb, c.name, out)
	eventually.True(tb, time.Minute, func() bool { s, _ := c.state(); return s == want }, verb+" "+c.name)
}

// jvmMemory reads the worker's resident memory and its peak, in KiB, from
// /proc, by the pid file connect.sh keeps.
func (w *world) jvmMemory() (rss, hwm int64, ok bool) {
	if w.script == "" {
		return 0, 0, false
	}
	run := os.Getenv("CONNECT_RUN_DIR")
	if run == "" {
		run = filepath.Join(filepath.Dir(w.script), "target", "run")
	}
	pid, err := os.ReadFile(filepath.Join(run, "connect.pid"))
	if err != nil {
		return 0, 0, false
	}
	status, err := os.ReadFile(filepath.Join("/proc", strings.TrimSpace(string(pid)), "status"))
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			hwm = v
		}
	}
	return rss, hwm, rss > 0
}
