// Command shards runs the SDK over several databases at once: three
// tenant schemas as the producer's shards, drained by one relay fleet, and
// a consumer that applies each order in the region database that owns it.
// Halfway through, one order moves from one shard to another while it is
// written to; its events reach the consumer as one continuous sequence.
//
//	go run ./examples/shards
//
// The shards and targets are schemas of one server here, as tenant schemas
// are; in production each may be a database of its own (see
// docs/shards.md). PostgreSQL comes from DATABASE_URL, or else a throwaway
// cluster started from the machine's binaries; Kafka from KAFKA_BROKERS,
// or else an in-process kfake cluster.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/localenv"
	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "shards:", err)
		os.Exit(1)
	}
}

// The example's schemas: three producer shards and two consumer targets.
var (
	shardSchemas  = []string{"shards_example_a", "shards_example_b", "shards_example_c"}
	targetSchemas = map[string]string{"eu": "shards_example_eu", "us": "shards_example_us"}
)

// orders are the aggregates, each written on its shard first: an order's
// id names the region that applies it.
var orders = map[string]int{"eu-1": 0, "eu-2": 1, "us-1": 1, "us-2": 2}

func run(ctx context.Context, out io.Writer) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	dbURL, stopDB, err := localenv.Database()
	if err != nil {
		return err
	}
	defer stopDB()
	brokers, stopKafka, err := localenv.Kafka()
	if err != nil {
		return err
	}
	defer stopKafka()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	// Fresh schemas per run keep the output the same on a shared server.
	var shards []shard.Shard
	for i, s := range shardSchemas {
		if err := freshSchema(ctx, pool, s, logger); err != nil {
			return err
		}
		shards = append(shards, shard.Shard{Name: fmt.Sprintf("tenant-%c", 'a'+i), Database: dbURL, Schema: s})
	}
	var targets []consumer.Target
	for _, name := range []string{"eu", "us"} {
		s := targetSchemas[name]
		if err := freshSchema(ctx, pool, s, logger); err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE `+s+`.shipments (n bigserial, order_id text, seq bigint, step text)`); err != nil {
			return err
		}
		targets = append(targets, consumer.Target{Name: name, DB: pool, Schema: s})
	}

	topic := fmt.Sprintf("shards-%d", time.Now().UnixNano())
	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return err
	}
	defer client.Close()
	if _, err := kadm.NewClient(client).CreateTopic(ctx, 4, 1, nil, topic); err != nil {
		return fmt.Errorf("create topic: %w", err)
	}

	// The producer: one fleet drains every shard.
	fleet, err := producer.NewFleet(client, shards, &producer.FleetConfig{Relay: producer.RelayConfig{Topic: topic, Logger: logger}})
	if err != nil {
		return err
	}
	// The consumer: each order applied in its region's target.
	group, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("shipping-" + topic),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, consumer.ClientOpts()...)...)
	if err != nil {
		return err
	}
	defer group.Close()
	c, err := consumer.New(nil, group, "shipping", consumer.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			region, _, _ := strings.Cut(m.AggregateID, "-")
			_, err := tx.Exec(ctx, `INSERT INTO `+targetSchemas[region]+`.shipments (order_id, seq, step) VALUES ($1, $2, $3)`, m.AggregateID, m.Seq, m.Value)
			return err
		}), &consumer.Config{Logger: logger, Route: &consumer.Route{
		Targets: targets,
		Owner: func(_, id string) (string, error) {
			region, _, _ := strings.Cut(id, "-")
			return region, nil
		},
	}})
	if err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	errs := make(chan error, 2)
	go func() { errs <- fleet.Run(runCtx) }()
	go func() { errs <- c.Run(runCtx) }()

	w := &writers{pool: pool, shards: shards, at: map[string]int{}}
	for id, s := range orders {
		w.at[id] = s
	}
	for _, step := range []string{"placed", "paid"} {
		if err := w.writeAll(ctx, step); err != nil {
			return err
		}
	}
	// eu-1 moves from tenant-a to tenant-c: tenant-a refuses it from now
	// on, naming tenant-c, and tenant-c goes on at the next sequence.
	from := move.Endpoint{Shard: shards[0], DB: pool}
	to := move.Endpoint{Shard: shards[2], DB: pool}
	id, err := move.Run(ctx, from, to, []move.Aggregate{{Type: "order", ID: "eu-1"}}, &move.Config{Logger: logger})
	if err != nil {
		return err
	}
	st, err := move.Get(ctx, id, from, to)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "moved eu-1 from %s to %s: %s\n", from.Shard.Name, to.Shard.Name, st.State)
	for _, step := range []string{"packed", "shipped"} {
		if err := w.writeAll(ctx, step); err != nil {
			return err
		}
	}
	if err := waitApplied(ctx, pool, 4*len(orders)); err != nil {
		return err
	}
	stopRun()
	for range 2 {
		if err := <-errs; err != nil {
			return err
		}
	}
	for _, region := range []string{"eu", "us"} {
		rows, err := pool.Query(ctx, `SELECT order_id || ' ' || seq || ' ' || step FROM `+targetSchemas[region]+`.shipments ORDER BY order_id, n`)
		if err != nil {
			return err
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		// In the order they were applied, per order: sequence and step.
		fmt.Fprintf(out, "target %s applied: %s\n", region, strings.Join(applied, ", "))
	}
	return nil
}

// freshSchema drops schema and migrates it anew.
func freshSchema(ctx context.Context, pool *pgxpool.Pool, schema string, logger *slog.Logger) error {
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
		return err
	}
	_, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema, Logger: logger})
	return err
}

// writers write each order's events on the shard it lives on, and follow
// it when a write says it moved.
type writers struct {
	pool   *pgxpool.Pool
	shards []shard.Shard
	at     map[string]int
}

// writeAll writes one event of step for every order, in order of id.
func (w *writers) writeAll(ctx context.Context, step string) error {
	for _, id := range []string{"eu-1", "eu-2", "us-1", "us-2"} {
		if err := w.write(ctx, id, step); err != nil {
			return err
		}
	}
	return nil
}

func (w *writers) write(ctx context.Context, id, step string) error {
	for {
		s := w.shards[w.at[id]]
		err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			_, err := producer.NewWriter(&producer.WriterConfig{Schema: s.Schema}).Write(ctx, tx,
				producer.Event{AggregateType: "order", AggregateID: id, EventType: "order." + step, Payload: []byte(step)})
			return err
		})
		var moved *producer.MovedError
		if !errors.As(err, &moved) {
			return err
		}
		for i, other := range w.shards {
			if other.Name == moved.To {
				w.at[id] = i
			}
		}
	}
}

// waitApplied waits until the targets applied n events in all.
func waitApplied(ctx context.Context, pool *pgxpool.Pool, n int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var got int
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+targetSchemas["eu"]+`.shipments) + (SELECT count(*) FROM `+targetSchemas["us"]+`.shipments)`).Scan(&got)
		if err != nil {
			return fmt.Errorf("wait for the consumer: %w", err)
		}
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the consumer applied %d of %d events: %w", got, n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
