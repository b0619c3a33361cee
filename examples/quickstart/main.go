// Command quickstart runs the SDK end to end: a business transaction that
// writes an order and its event together, the relay that publishes
// committed events to Kafka, and a consumer whose handler applies each
// event through consumer.Handle: once, in order, in the same transaction as
// its effect. A rolled-back order shows that its event never leaves; a
// second delivery of every record shows duplicates skipped; at the end it
// prints what it measured through the SDK's tracing hooks.
//
//	go run ./examples/quickstart
//
// PostgreSQL comes from DATABASE_URL, or else a throwaway cluster started
// from the machine's binaries; Kafka from KAFKA_BROKERS, or else an
// in-process kfake cluster.
package main

import (
	"context"
	"encoding/json"
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
	"github.com/d419a114/outbox/producer"
)

const topic = "orders"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

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
	if _, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Logger: logger}); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, total_cents bigint NOT NULL)`); err != nil {
		return fmt.Errorf("create orders table: %w", err)
	}

	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer client.Close()
	if _, err := kadm.NewClient(client).CreateTopic(ctx, 3, 1, nil, topic); err != nil && !strings.Contains(err.Error(), "TOPIC_ALREADY_EXISTS") {
		return fmt.Errorf("create topic: %w", err)
	}

	// The relay publishes in the background until the context ends.
	// The meter counts and times through the SDK's tracing hooks.
	m := newMeter()
	relay, err := producer.NewRelay(pool, client, &producer.RelayConfig{Topic: topic, Logger: logger, Tracer: m})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	defer func() {
		stopRelay()
		if err := <-relayDone; err != nil {
			logger.Error("relay stopped", slog.Any("error", err))
		}
	}()

	// Business transactions: the order row and its event commit together.
	start := time.Now().UnixNano() % 1_000_000_000
	var placed []string
	for i := range int64(4) {
		id := start + i
		commit := i != 2 // the third order changes its mind
		if err := placeOrder(ctx, pool, id, 1000*(i+1), commit); err != nil {
			return err
		}
		if commit {
			placed = append(placed, fmt.Sprint(id))
		}
		fmt.Fprintf(out, "order %d: %s\n", id, map[bool]string{true: "committed", false: "rolled back"}[commit])
	}

	// The consuming service: its handler applies an event's effect in the
	// transaction consumer.Handle opens, which also records the event's
	// idempotency key and the aggregate's position.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS revenue (order_id text PRIMARY KEY, cents bigint NOT NULL)`); err != nil {
		return fmt.Errorf("create revenue table: %w", err)
	}
	process, err := consumer.Handle(pool, "billing", consumer.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var placed struct {
				TotalCents int64 `json:"total_cents"`
			}
			if err := json.Unmarshal(m.Value, &placed); err != nil {
				return consumer.Permanent(fmt.Errorf("decode order.placed: %w", err))
			}
			_, err := tx.Exec(ctx, `INSERT INTO revenue (order_id, cents) VALUES ($1, $2)`, m.AggregateID, placed.TotalCents)
			return err
		}), &consumer.Config{Logger: logger, Tracer: m})
	if err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Read the topic twice, as a redelivery after a crash would: the second
	// time every record is a duplicate and the handler does not run.
	for pass := 1; pass <= 2; pass++ {
		reader, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			return err
		}
		for seen := 0; seen < 3; {
			fetches := reader.PollFetches(waitCtx)
			if err := waitCtx.Err(); err != nil {
				reader.Close()
				return fmt.Errorf("wait for events: %w", err)
			}
			for _, r := range fetches.Records() {
				if time.Since(r.Timestamp) > time.Minute {
					continue // an earlier run's event, when the broker is shared
				}
				res, err := process.Process(waitCtx, r)
				if err != nil {
					reader.Close()
					return err
				}
				seen++
				fmt.Fprintf(out, "delivery %d: key=%s %s -> %s\n", pass, r.Key, headers(r), res.Outcome)
			}
		}
		reader.Close()
	}
	var orders, cents int64
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(cents), 0) FROM revenue WHERE order_id = ANY($1)`, placed).Scan(&orders, &cents); err != nil {
		return err
	}
	fmt.Fprintf(out, "revenue: %d orders, %d cents (each effect applied once)\n", orders, cents)

	// The relay marks a batch right after the broker acknowledges it.
	inspector, err := producer.NewInspector(pool, "")
	if err != nil {
		return err
	}
	var h producer.Health
	for h.Undelivered = -1; h.Undelivered != 0; time.Sleep(10 * time.Millisecond) {
		if h, err = inspector.Health(waitCtx); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "health: undelivered=%d oldest=%s dead=%d\n", h.Undelivered, h.OldestUndelivered.Round(time.Millisecond), h.Dead)
	m.print(out)
	return nil
}

func placeOrder(ctx context.Context, pool *pgxpool.Pool, id, cents int64, commit bool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after Commit
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES ($1, $2)`, id, cents); err != nil {
		return err
	}
	_, err = producer.Write(ctx, tx, producer.Event{
		AggregateType: "order",
		AggregateID:   fmt.Sprint(id),
		EventType:     "order.placed",
		ContentType:   "application/json",
		Payload:       fmt.Appendf(nil, `{"order_id":%d,"total_cents":%d}`, id, cents),
	})
	if err != nil {
		return err
	}
	if !commit {
		return tx.Rollback(ctx)
	}
	return tx.Commit(ctx)
}

func headers(r *kgo.Record) string {
	var b strings.Builder
	for _, h := range r.Headers {
		if h.Key == outbox.HeaderEventType || h.Key == outbox.HeaderAggregateSeq {
			fmt.Fprintf(&b, "%s=%s ", h.Key, h.Value)
		}
	}
	return strings.TrimSpace(b.String())
}
