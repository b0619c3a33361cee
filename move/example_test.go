package move_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

// Move one order from shard eu-1 to shard eu-2 while eu-1's relay
// delivers its earlier events; its next event on eu-2 continues the
// sequence, and eu-1 refuses it, naming eu-2.
func ExampleRun() {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	// Two shards: here two schemas of one test database.
	src, closeSrc, err := pgtest.Open(nil)
	if err != nil {
		panic(err)
	}
	defer closeSrc()
	dst, closeDst, err := pgtest.Open(nil)
	if err != nil {
		panic(err)
	}
	defer closeDst()
	from := move.Endpoint{Shard: shard.Shard{Name: "eu-1", Schema: src.Schema}, DB: src.Pool}
	to := move.Endpoint{Shard: shard.Shard{Name: "eu-2", Schema: dst.Schema}, DB: dst.Pool}

	write := func(db *pgtest.DB) (int64, error) {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(ctx)
		w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
		out, err := w.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: "8842", EventType: "order.placed"})
		if err != nil {
			return 0, err
		}
		return out[0].Seq, tx.Commit(ctx)
	}
	for range 2 {
		if _, err := write(src); err != nil {
			panic(err)
		}
	}

	// eu-1's relay delivers its events while the move waits for them.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "order"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	relay, err := producer.NewRelay(src.Pool, client, &producer.RelayConfig{Schema: src.Schema, Logger: quiet})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	defer func() { stop(); <-done }()

	id, err := move.Run(ctx, from, to, []move.Aggregate{{Type: "order", ID: "8842"}}, &move.Config{Logger: quiet})
	if err != nil {
		panic(err)
	}
	st, err := move.Get(ctx, id, from, to)
	if err != nil {
		panic(err)
	}
	fmt.Println("move:", st.State)

	seq, err := write(dst)
	if err != nil {
		panic(err)
	}
	fmt.Println("next event on eu-2: seq", seq)

	_, err = write(src)
	var moved *producer.MovedError
	if errors.As(err, &moved) {
		fmt.Println("eu-1 refuses it: moved to", moved.To)
	}
	// Output:
	// move: done
	// next event on eu-2: seq 3
	// eu-1 refuses it: moved to eu-2
}
