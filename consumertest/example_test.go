package consumertest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/consumertest"
	"github.com/d419a114/outbox/producer"
)

// ExampleCheck tests a handler of payments on a database of your own:
// here the one TEST_DATABASE_URL names, as a test would open it (in a
// test, call t.Skip when it is unset, and consumertest.Run(t, cfg), which
// fails t with the same report). The handler writes its effect in the
// transaction it is given; one that wrote with the pool instead would
// fail, because a try the consumer rolls back would still leave its row.
func ExampleCheck() {
	ctx := context.Background()
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		log.Fatal("set TEST_DATABASE_URL to a PostgreSQL database the test may write to")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS payments (id bigint GENERATED ALWAYS AS IDENTITY, event_id text, amount text)`); err != nil {
		log.Fatal(err)
	}

	err = consumertest.Check(ctx, consumertest.Config{
		DB: pool,
		// The events as the service writes them; Records stamps them as
		// producer.Write and the relay would (ids, sequences 1, 2, 3).
		Records: consumertest.Records(
			producer.Event{AggregateType: "account", AggregateID: "acct-1", EventType: "paid", Payload: []byte("10")},
			producer.Event{AggregateType: "account", AggregateID: "acct-1", EventType: "paid", Payload: []byte("20")},
			producer.Event{AggregateType: "account", AggregateID: "acct-2", EventType: "paid", Payload: []byte("30")},
		),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO payments (event_id, amount) VALUES ($1, $2)`, m.IdempotencyKey, string(m.Value))
			return err
		}),
		Reset: func(ctx context.Context, db *pgxpool.Pool) error {
			_, err := db.Exec(ctx, `TRUNCATE payments`)
			return err
		},
		Applied: func(ctx context.Context, db *pgxpool.Pool) ([]string, error) {
			rows, _ := db.Query(ctx, `SELECT event_id FROM payments ORDER BY id`)
			return pgx.CollectRows(rows, pgx.RowTo[string])
		},
	})
	var f *consumertest.Failure
	switch {
	case errors.As(err, &f):
		fmt.Println("the handler is wrong:", f.Problem)
	case err != nil:
		fmt.Println("the test could not run:", err)
	default:
		fmt.Println("passed")
	}
}
