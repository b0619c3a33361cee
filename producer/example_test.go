package producer_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

// An order and its event commit together, or neither does.
func ExampleWriter_Write() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil) // your pool and schema ("outbox" by default)
	if err != nil {
		panic(err)
	}
	defer closeDB()
	writer := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback(ctx)
	// ... the business change, e.g. INSERT INTO orders ..., goes here ...
	written, err := writer.Write(ctx, tx,
		producer.Event{AggregateType: "order", AggregateID: "8842", EventType: "order.placed", Payload: []byte(`{"total_cents":2500}`)},
		producer.Event{AggregateType: "order", AggregateID: "8842", EventType: "order.paid", Payload: []byte(`{}`)},
	)
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	for _, w := range written {
		fmt.Println("order 8842 event", w.Seq)
	}
	// Output:
	// order 8842 event 1
	// order 8842 event 2
}

// A relay publishes committed events until its context ends.
func ExampleRelay_Run() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		panic(err)
	}
	defer closeDB()
	// Topics are yours to create; the relay never creates them.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	defer client.Close()

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	_, err = producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}).Write(ctx, tx,
		producer.Event{AggregateType: "order", AggregateID: "8842", EventType: "order.placed", Payload: []byte(`{"total_cents":2500}`)})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}

	relay, err := producer.NewRelay(db.Pool, client, &producer.RelayConfig{
		Schema: db.Schema,
		Topic:  "orders",
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()

	reader, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer reader.Close()
	pollCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, r := range reader.PollFetches(pollCtx).Records() {
		fmt.Printf("%s: %s\n", r.Key, r.Value)
	}

	stop()
	fmt.Println("stopped:", <-done) // nil: a stop through ctx is a clean one
	// Output:
	// 8842: {"total_cents":2500}
	// stopped: <nil>
}

// A fleet relays many tenant schemas from one process; the shards of one
// server share a pool, one lock session and one LISTEN session.
func ExampleNewFleet() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil) // a tenant's schema; a real fleet lists many
	if err != nil {
		panic(err)
	}
	defer closeDB()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	defer client.Close()

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	_, err = producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}).Write(ctx, tx,
		producer.Event{AggregateType: "order", AggregateID: "8842", EventType: "order.placed", Payload: []byte(`{"total_cents":2500}`)})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}

	// Usually shard.Load("fleet.json"); the shards of one server share at
	// most MaxConnsPerServer connections, however many they are.
	shards := []shard.Shard{{Name: "tenant-a", Database: db.Server.URL, Schema: db.Schema}}
	fleet, err := producer.NewFleet(client, shards, &producer.FleetConfig{
		Relay:             producer.RelayConfig{Topic: "orders", Logger: slog.New(slog.DiscardHandler)},
		MaxConnsPerServer: 10,
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fleet.Run(runCtx) }()

	reader, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer reader.Close()
	pollCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, r := range reader.PollFetches(pollCtx).Records() {
		fmt.Printf("%s: %s\n", r.Key, r.Value)
	}
	// Shards come and go while the fleet runs: a removed one lands its
	// batch in flight and releases its buckets.
	if err := fleet.Set(nil); err != nil {
		panic(err)
	}
	fmt.Println("shards:", len(fleet.Health()))

	stop()
	fmt.Println("stopped:", <-done)
	// Output:
	// 8842: {"total_cents":2500}
	// shards: 0
	// stopped: <nil>
}
