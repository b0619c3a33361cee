package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pacedwrite"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// BenchmarkEndToEnd writes one event per transaction at a steady rate
// (producer.Write), publishes with producer.Relay, and consumes with a
// consumer.Consumer (dedupe and ordering on) whose handler inserts a row.
// It reports the latency from the writer's commit returning to the
// consumer's handler running, p50 and p99, with one record per consumer
// transaction and with batches of up to 100, and the p99 of its two legs:
// commit to the relay producing the record (the record's timestamp), and
// that to the handler, over five seconds after a second of warm-up.
// Writers, relay, consumer and PostgreSQL share the machine.
//
//	go test -run '^$' -bench EndToEnd -benchtime 1x ./consumer
func BenchmarkEndToEnd(b *testing.B) {
	for _, batch := range []int{1, 100} {
		for _, rate := range []int{300, 1000} {
			b.Run(fmt.Sprintf("batch=%d/rate=%d", batch, rate), func(b *testing.B) {
				for b.Loop() {
					l := endToEnd(b, rate, batch, 5*time.Second)
					ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
					b.ReportMetric(ms(l.p50), "p50-ms")
					b.ReportMetric(ms(l.p99), "p99-ms")
					b.ReportMetric(ms(l.relayP99), "relay-p99-ms")
					b.ReportMetric(ms(l.consumeP99), "consume-p99-ms")
				}
			})
		}
	}
}

// latencies are one run's percentiles.
type latencies struct{ p50, p99, relayP99, consumeP99 time.Duration }

func endToEnd(b *testing.B, rate, batch int, dur time.Duration) latencies {
	ctx := context.Background()
	db := pgtest.New(b, &pgtest.Opts{MaxConns: 30})
	broker := kafkatest.New(b)
	topic := broker.Topic(b, 8)
	relayPool, err := pgxpool.New(ctx, db.Server.URL)
	require.NoError(b, err)
	defer relayPool.Close()
	relay, err := producer.NewRelay(relayPool, broker.Client(b), &producer.RelayConfig{Schema: db.Schema, Topic: topic, Logger: quietLogger})
	require.NoError(b, err)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(runCtx) }()

	effects := db.Table("e2e_effects")
	_, err = db.Pool.Exec(ctx, `CREATE TABLE `+effects+` (event_id text PRIMARY KEY)`)
	require.NoError(b, err)
	var (
		mu      sync.Mutex
		handled = map[string]time.Time{}
		// produced is each record's timestamp, set by the relay's client
		// when it produced the record.
		produced = map[string]time.Time{}
	)
	// pacedwrite.Run writes a second of warm-up first (rate events).
	warmup, total := rate, rate*int(dur/time.Second)
	allHandled := make(chan struct{})
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		now := time.Now()
		if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` VALUES ($1)`, m.EventID); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if _, seen := handled[m.EventID]; !seen {
			handled[m.EventID] = now
			produced[m.EventID] = m.Timestamp
			if len(handled) == warmup+total {
				close(allHandled)
			}
		}
		return nil
	})
	cl := broker.Client(b, append([]kgo.Opt{kgo.ConsumerGroup("e2e"), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(10 * time.Millisecond)}, consumer.ClientOpts()...)...)
	c, err := consumer.New(db.Pool, cl, "e2e", h, &consumer.Config{Schema: db.Schema, BatchSize: batch, Logger: quietLogger})
	require.NoError(b, err)
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- c.Run(runCtx) }()
	defer func() {
		stop()
		<-relayDone
		<-consumerDone
	}()

	committed := pacedwrite.Run(ctx, b, db.Pool, producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}), rate, total, func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(handled)
	})
	select {
	case <-allHandled:
	case <-time.After(dur + 60*time.Second):
		b.Fatalf("handled %d of %d events", len(handled), warmup+total)
	}
	mu.Lock()
	defer mu.Unlock()
	var l latencies
	l.p50, l.p99 = pacedwrite.Percentiles(committed, handled)
	_, l.relayP99 = pacedwrite.Percentiles(committed, produced)
	measured := make(map[string]time.Time, len(committed))
	for id := range committed {
		measured[id] = produced[id]
	}
	_, l.consumeP99 = pacedwrite.Percentiles(measured, handled)
	return l
}
