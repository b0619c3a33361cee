package outboxprom_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/outboxprom"
	"github.com/d419a114/outbox/producer"
)

// A consumer's metrics count each record by topic and outcome; a record
// delivered twice is applied once and counted as a duplicate the second
// time. In a service, serve reg with promhttp.HandlerFor.
func ExampleNewConsumerMetrics() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()

	reg := prometheus.NewRegistry()
	metrics, err := outboxprom.NewConsumerMetrics(reg, "billing")
	if err != nil {
		fmt.Println(err)
		return
	}
	apply := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	p, err := consumer.Handle(db.Pool, "billing", apply, &consumer.Config{Schema: db.Schema, Tracer: metrics})
	if err != nil {
		fmt.Println(err)
		return
	}
	rec := &kgo.Record{Topic: "orders", Key: []byte("o-1"), Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte("evt-1")}}}
	for range 2 {
		if _, err := p.Process(ctx, rec); err != nil {
			fmt.Println(err)
			return
		}
	}
	text, err := testutil.GatherAndFormat(reg, expfmt.TypeTextPlain, outboxprom.ConsumerRecords)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(string(text))
	// Output:
	// # HELP outbox_consumer_records_total Records the consumer was done with (applied, duplicate, parked, dead_lettered) or handed back (not_done), by topic and outcome.
	// # TYPE outbox_consumer_records_total counter
	// outbox_consumer_records_total{consumer="billing",outcome="applied",topic="orders"} 1
	// outbox_consumer_records_total{consumer="billing",outcome="duplicate",topic="orders"} 1
}

// The health collector reports the backlog the relay has yet to deliver:
// here two events written while no relay runs.
func ExampleNewHealthCollector() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()

	w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx,
			producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.placed", Payload: []byte(`{}`)},
			producer.Event{AggregateType: "order", AggregateID: "o-2", EventType: "order.placed", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	health, err := outboxprom.NewHealthCollector(db.Pool, &outboxprom.HealthConfig{Schema: db.Schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(health); err != nil {
		fmt.Println(err)
		return
	}
	text, err := testutil.GatherAndFormat(reg, expfmt.TypeTextPlain, outboxprom.EventsUndelivered, outboxprom.EventsDead)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(string(text))
	// Output:
	// # HELP outbox_events_dead Events that exhausted their attempts and wait for a replay or discard.
	// # TYPE outbox_events_dead gauge
	// outbox_events_dead 0
	// # HELP outbox_events_undelivered Events the broker has not acknowledged.
	// # TYPE outbox_events_undelivered gauge
	// outbox_events_undelivered 2
}

// One registry serves the health of every shard of a fleet: each shard's
// collector registers through ForShard, and its series carry the shard.
// Relay and consumer metrics take ForShard's registerer the same way.
func ExampleForShard() {
	ctx := context.Background()
	shards := []string{"eu-1", "us-1"}
	reg := prometheus.NewRegistry()
	for i, name := range shards {
		db, closeDB, err := pgtest.Open(nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer func() { _ = closeDB() }()
		w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
		for range i {
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := w.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.placed", Payload: []byte(`{}`)})
				return err
			})
			if err != nil {
				fmt.Println(err)
				return
			}
		}
		health, err := outboxprom.NewHealthCollector(db.Pool, &outboxprom.HealthConfig{Schema: db.Schema})
		if err != nil {
			fmt.Println(err)
			return
		}
		sr, err := outboxprom.ForShard(reg, name)
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := sr.Register(health); err != nil {
			fmt.Println(err)
			return
		}
	}
	text, err := testutil.GatherAndFormat(reg, expfmt.TypeTextPlain, outboxprom.EventsUndelivered)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(string(text))
	// Output:
	// # HELP outbox_events_undelivered Events the broker has not acknowledged.
	// # TYPE outbox_events_undelivered gauge
	// outbox_events_undelivered{shard="eu-1"} 0
	// outbox_events_undelivered{shard="us-1"} 1
}
