package outboxprom_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

var quiet = slog.New(slog.DiscardHandler)

// series returns the series of name in g whose labels include labels,
// given as name, value pairs.
func series(t testing.TB, g prometheus.Gatherer, name string, labels ...string) []*dto.Metric {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	var out []*dto.Metric
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metrics
				}
			}
			out = append(out, m)
		}
	}
	return out
}

// value returns the value of the one counter or gauge series of name with
// labels, failing unless there is exactly one.
func value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	s := series(t, g, name, labels...)
	require.Len(t, s, 1, "series of %s with %v", name, labels)
	if c := s[0].GetCounter(); c != nil {
		return c.GetValue()
	}
	return s[0].GetGauge().GetValue()
}

// histogram returns the count and sum of the one histogram series of name
// with labels, or zeros when there is none.
func histogram(t testing.TB, g prometheus.Gatherer, name string, labels ...string) (uint64, float64) {
	t.Helper()
	s := series(t, g, name, labels...)
	require.LessOrEqual(t, len(s), 1, "series of %s with %v", name, labels)
	if len(s) == 0 {
		return 0, 0
	}
	return s[0].GetHistogram().GetSampleCount(), s[0].GetHistogram().GetSampleSum()
}

// write commits events in db's outbox in one transaction.
func write(t testing.TB, db *pgtest.DB, events ...producer.Event) {
	t.Helper()
	w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
	require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		_, err := w.Write(context.Background(), tx, events...)
		return err
	}))
}

// events returns n events, each of its own aggregate, for topic.
func events(topic string, n int) []producer.Event {
	out := make([]producer.Event, n)
	for i := range out {
		out[i] = producer.Event{AggregateType: "account", AggregateID: fmt.Sprintf("acc-%d", i),
			EventType: "funds.moved", Payload: []byte("{}"), Topic: topic}
	}
	return out
}

// startRelay runs a relay of db's outbox on broker until the test ends.
func startRelay(t *testing.T, db *pgtest.DB, broker *kafkatest.Broker, cfg producer.RelayConfig) {
	t.Helper()
	cfg.Schema, cfg.Logger = db.Schema, quiet
	relay, err := producer.NewRelay(db.Pool, broker.Client(t), &cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("relay did not return within 30s of cancellation")
		}
	})
}

// failingHandler applies every record but those of aggregate "p", whose
// handler fails.
var failingHandler = consumer.HandlerFunc(func(_ context.Context, _ pgx.Tx, m *consumer.Message) error {
	if m.AggregateID == "p" {
		return errBroken
	}
	return nil
})

var errBroken = errors.New("downstream broken")

// nextOffset gives every test record its own offset, as a partition would.
var nextOffset atomic.Int64

// rec builds a record of the wire contract on topic: aggregate "order"/agg
// at seq, keyed by key, written at occurred (no occurred-at header when it
// is zero).
func rec(topic, agg string, seq int64, key string, occurred time.Time) *kgo.Record {
	r := &kgo.Record{Topic: topic, Key: []byte(agg), Value: []byte("{}"), Offset: nextOffset.Add(1)}
	r.Headers = append(r.Headers,
		kgo.RecordHeader{Key: outbox.HeaderEventID, Value: []byte(key)},
		kgo.RecordHeader{Key: outbox.HeaderAggregateType, Value: []byte("order")},
		kgo.RecordHeader{Key: outbox.HeaderAggregateID, Value: []byte(agg)},
		kgo.RecordHeader{Key: outbox.HeaderAggregateSeq, Value: []byte(strconv.FormatInt(seq, 10))},
	)
	if !occurred.IsZero() {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderOccurredAt, Value: []byte(occurred.UTC().Format(time.RFC3339Nano))})
	}
	return r
}
