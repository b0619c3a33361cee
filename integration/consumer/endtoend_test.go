package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// broker is the integration suite's rule: KAFKA_BROKERS when set, kfake
// otherwise, and never kfake when INTEGRATION_REQUIRE_KAFKA is set.
func broker(t *testing.T) *kafkatest.Broker {
	t.Helper()
	if os.Getenv("INTEGRATION_REQUIRE_KAFKA") != "" && os.Getenv("KAFKA_BROKERS") == "" {
		t.Fatal("INTEGRATION_REQUIRE_KAFKA is set but KAFKA_BROKERS is empty; start a broker with integration/kafka/broker.sh start")
	}
	b := kafkatest.New(t)
	if b.Fake != nil {
		t.Logf("Kafka: in-process kfake at %v", b.Addrs)
	} else {
		t.Logf("Kafka: real brokers at %v (KAFKA_BROKERS)", b.Addrs)
	}
	return b
}

// topic creates a topic, retrying while the broker is unreachable: the
// integration suite's other package restarts the shared real broker, and go
// test runs packages at the same time.
func topic(t *testing.T, b *kafkatest.Broker, partitions int32) string {
	t.Helper()
	name := fmt.Sprintf("consumer-%d", time.Now().UnixNano())
	adm := kadm.NewClient(b.Client(t))
	var last error
	eventually.True(t, 2*time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := adm.CreateTopic(ctx, partitions, 1, nil, name)
		if err == nil {
			err = resp.Err
		}
		if errors.Is(err, kerr.TopicAlreadyExists) {
			err = nil
		}
		last = err
		return err == nil
	}, "create topic", &last)
	return name
}

// TestWriterRelayConsumer writes events for a set of aggregates, publishes
// them with a relay, publishes every record a second time (as a relay that
// crashed after sending and before marking would), and consumes with two
// group members of which one joins late and one leaves early. Every event
// must be applied exactly once, each aggregate's in sequence order, with
// nothing parked or dead-lettered; in both consumer modes.
func TestWriterRelayConsumer(t *testing.T) {
	t.Parallel()
	for _, run := range runs([]int{1, 50}) {
		batch, concurrency := run.batch, run.concurrency
		t.Run(run.name, func(t *testing.T) {
			t.Parallel()
			const aggregates, perAggregate = 12, 15
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			db := pgtest.New(t, &pgtest.Opts{MaxConns: 20})
			b := broker(t)
			topic := topic(t, b, 4)
			published := writeAndPublishTwice(ctx, t, db, b, topic, aggregates, perAggregate)
			total := len(published)

			// Two members; the second joins after the first applied some,
			// and the first leaves before the end.
			group := "g-" + topic
			h := effectsHandler(db)
			cfg := &consumer.Config{Schema: db.Schema, BatchSize: batch, Concurrency: concurrency, Logger: quiet, MaxPollRecords: 20}
			opts := append([]kgo.Opt{kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, consumer.ClientOpts()...)
			stop2 := comeAndGo(ctx, t, db, b, total, h, cfg, opts...)
			adm := kadm.NewClient(b.Client(t))
			eventually.True(t, 2*time.Minute, func() bool {
				offs, err := adm.FetchOffsets(ctx, group)
				if err != nil {
					return false
				}
				var sum int64
				offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
				return sum == int64(2*total)
			}, "all offsets committed")
			stop2()

			requireAppliedOnce(ctx, t, db, total)
			for a := range aggregates {
				r, err := db.Pool.Query(ctx, `SELECT seq FROM `+db.Table("effects")+` WHERE aggregate = $1 ORDER BY n`, fmt.Sprint("acc-", a))
				require.NoError(t, err)
				seqs, err := pgx.CollectRows(r, pgx.RowTo[int64])
				require.NoError(t, err)
				want := make([]int64, perAggregate)
				for i := range want {
					want[i] = int64(i + 1)
				}
				require.Equal(t, want, seqs)
			}
			requireNothingSetAside(ctx, t, db)
		})
	}
}

// comeAndGo runs two members of a group, each a client with opts: the
// second joins after the first applied a quarter of total events, and the
// first leaves after half were applied. It returns the stop of the second,
// which is also called when the test ends.
func comeAndGo(ctx context.Context, t *testing.T, db *pgtest.DB, b *kafkatest.Broker, total int, h consumer.Handler, cfg *consumer.Config, opts ...kgo.Opt) (stop2 func()) {
	t.Helper()
	start := func() (stop func()) {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.Addrs...), kgo.FetchMaxWait(100 * time.Millisecond)}, opts...)...)
		require.NoError(t, err)
		c, err := consumer.New(db.Pool, cl, "ledger", h, cfg)
		require.NoError(t, err)
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		var once sync.Once
		stop = func() {
			once.Do(func() {
				cancel()
				require.NoError(t, <-done)
				cl.Close()
			})
		}
		t.Cleanup(stop)
		return stop
	}
	applied := func() int { return appliedCount(ctx, t, db) }
	stop1 := start()
	eventually.True(t, time.Minute, func() bool { return applied() >= total/4 }, "a quarter applied by the first member")
	stop2 = start()
	eventually.True(t, time.Minute, func() bool { return applied() >= total/2 }, "half applied by both")
	stop1()
	return stop2
}

// writeAndPublishTwice writes perAggregate events for each of aggregates
// accounts through producer.Write, in transactions of one event per
// aggregate, publishes them to topic with a relay, and publishes every
// record a second time, as a relay that crashed after sending and before
// marking would. It returns the records the relay published.
func writeAndPublishTwice(ctx context.Context, t *testing.T, db *pgtest.DB, b *kafkatest.Broker, topic string, aggregates, perAggregate int) []*kgo.Record {
	t.Helper()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Table("effects")+` (
		n bigint GENERATED ALWAYS AS IDENTITY, event_id text NOT NULL, aggregate text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(t, err)

	// Write, in transactions of a few events each.
	w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
	for s := 0; s < perAggregate; s++ {
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			for a := range aggregates {
				if _, err := w.Write(ctx, tx, producer.Event{AggregateType: "account", AggregateID: fmt.Sprint("acc-", a),
					EventType: "credited", Payload: fmt.Appendf(nil, `{"step":%d}`, s)}); err != nil {
					return err
				}
			}
			return nil
		}))
	}

	// Relay.
	relayPool, err := pgxpool.New(ctx, db.Server.URL)
	require.NoError(t, err)
	defer relayPool.Close()
	relay, err := producer.NewRelay(relayPool, b.Client(t), &producer.RelayConfig{Schema: db.Schema, Topic: topic, Logger: quiet})
	require.NoError(t, err)
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	total := aggregates * perAggregate
	published := b.Records(t, topic, total, time.Minute)
	stopRelay()
	require.NoError(t, <-relayDone)
	require.Len(t, published, total)

	// Everything again, as a second delivery.
	again := b.Client(t)
	for _, r := range published {
		r2 := &kgo.Record{Topic: topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers}
		require.NoError(t, again.ProduceSync(ctx, r2).FirstErr())
	}
	return published
}

// effectsHandler records each message's event, aggregate and sequence in
// the effects table writeAndPublishTwice creates.
func effectsHandler(db *pgtest.DB) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+db.Table("effects")+` (event_id, aggregate, seq) VALUES ($1, $2, $3)`, m.EventID, m.AggregateID, m.Seq)
		return err
	})
}

// appliedCount counts the effect rows.
func appliedCount(ctx context.Context, t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("effects")).Scan(&n))
	return n
}

// requireAppliedOnce fails unless there are total effects, one per event.
func requireAppliedOnce(ctx context.Context, t *testing.T, db *pgtest.DB, total int) {
	t.Helper()
	var rows, distinct int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+db.Table("effects")).Scan(&rows, &distinct))
	require.Equal(t, total, rows)
	require.Equal(t, total, distinct)
}

// requireNothingSetAside fails unless nothing is parked or dead-lettered.
func requireNothingSetAside(ctx context.Context, t *testing.T, db *pgtest.DB) {
	t.Helper()
	var parked, dead int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+db.Table("parked")+`), (SELECT count(*) FROM `+db.Table("dead_letters")+`)`).Scan(&parked, &dead))
	require.Zero(t, parked)
	require.Zero(t, dead)
}
