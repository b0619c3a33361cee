// Command pollloop shows consumer.Handle inside a franz-go poll loop that a
// service already has: the loop keeps its own client, polling and offset
// commits; consumer.Handle adds dedupe, per-aggregate ordering and dead
// letters around the handler, in the handler's own transaction.
//
//	go run ./examples/pollloop
//
// The records it consumes are made to be awkward: one is delivered twice,
// one aggregate's events arrive out of order, and one record has no key.
// PostgreSQL comes from DATABASE_URL, or else a throwaway cluster started
// from the machine's binaries; Kafka from KAFKA_BROKERS, or else an
// in-process kfake cluster.
package main

import (
	"context"
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
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/localenv"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pollloop:", err)
		os.Exit(1)
	}
}

const schema = "pollloop_example"

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
	// A fresh schema per run keeps the output the same on a shared server.
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
		return err
	}
	if _, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema, Logger: logger}); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.shipments (order_id text, step text, at timestamptz DEFAULT now())`); err != nil {
		return err
	}

	topic := fmt.Sprintf("pollloop-%d", time.Now().UnixNano())
	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := kadm.NewClient(admin).CreateTopic(ctx, 2, 1, nil, topic); err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	if err := produce(ctx, admin); err != nil {
		return err
	}

	// The service's existing client and loop. Offsets are committed by the
	// loop, after consumer.Handle's transaction committed.
	client, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup("shipping-"+topic),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)
	if err != nil {
		return err
	}
	defer client.Close()

	process, err := consumer.Handle(pool, "shipping", consumer.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.shipments (order_id, step) VALUES ($1, $2)`, m.AggregateID, m.Value)
			return err
		}), &consumer.Config{Schema: schema, Logger: logger})
	if err != nil {
		return err
	}

	loopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for seen := 0; seen < 6; {
		fetches := client.PollFetches(loopCtx)
		if err := loopCtx.Err(); err != nil {
			return fmt.Errorf("wait for records: %w", err)
		}
		var done []*kgo.Record
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			for _, r := range p.Records {
				res, err := process.Process(loopCtx, r)
				if err != nil {
					// Not done: stop this partition here; its offset is not
					// committed and the record comes back.
					fmt.Fprintln(out, "not done, will be redelivered:", err)
					return
				}
				seen++
				done = append(done, r)
				fmt.Fprintf(out, "partition %d offset %d key=%s: %s%s\n", r.Partition, r.Offset, r.Key, res.Outcome, drained(res))
			}
		})
		if err := client.CommitRecords(loopCtx, done...); err != nil {
			return fmt.Errorf("commit offsets: %w", err)
		}
		// A loop that runs for good also calls process.DrainReady and
		// process.PruneKeys now and then, as consumer.Run does.
	}

	rows, err := pool.Query(ctx, `SELECT order_id || ': ' || step FROM `+schema+`.shipments ORDER BY order_id, at`)
	if err != nil {
		return err
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "applied, in order per order:", strings.Join(applied, ", "))
	letters, err := process.Inspector().Letters(ctx, &deadletter.ListOpts{Consumer: process.Name()})
	if err != nil {
		return err
	}
	for _, l := range letters {
		fmt.Fprintf(out, "dead letter %d: %s\n", l.ID, l.Error)
	}
	return nil
}

func drained(r consumer.Result) string {
	if r.Drained == 0 {
		return ""
	}
	return fmt.Sprintf(" (and %d parked after it)", r.Drained)
}

// produce writes what a relay could deliver: order 7's events with one
// delivered twice, order 9's out of order, and a record from some other
// producer without any key.
func produce(ctx context.Context, cl *kgo.Client) error {
	ev := func(order string, seq int, step string) *kgo.Record {
		return &kgo.Record{Key: []byte(order), Value: []byte(step), Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderEventID, Value: fmt.Appendf(nil, "%s-%d", order, seq)},
			{Key: outbox.HeaderAggregateType, Value: []byte("order")},
			{Key: outbox.HeaderAggregateSeq, Value: fmt.Appendf(nil, "%d", seq)},
		}}
	}
	recs := []*kgo.Record{
		ev("7", 1, "paid"), ev("7", 1, "paid"), ev("9", 2, "packed"), ev("9", 1, "paid"),
		{Key: []byte("9"), Value: []byte("no key at all")},
		ev("7", 2, "packed"),
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}
