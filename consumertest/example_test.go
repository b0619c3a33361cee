package consumertest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/consumertest"
	"github.com/d419a114/outbox/internal/pgtest"
)

// ExampleCheck tests two handlers of payments: one that writes its effect
// in the transaction it is given, and one that writes with the pool, so
// that a try the consumer rolls back still leaves its row. In a test,
// consumertest.Run(t, cfg) does the same and fails t.
func ExampleCheck() {
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		panic(err)
	}
	defer closeDB()
	ctx := context.Background()
	table := db.Table("payments")
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+table+` (id bigint GENERATED ALWAYS AS IDENTITY, event_id text, amount text)`); err != nil {
		panic(err)
	}
	var records []*kgo.Record
	for i, amount := range []string{"10", "20", "30"} {
		records = append(records, &kgo.Record{Key: []byte("acct-1"), Value: []byte(amount), Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderEventID, Value: []byte(fmt.Sprintf("pay-%d", i+1))},
			{Key: outbox.HeaderAggregateType, Value: []byte("account")},
			{Key: outbox.HeaderAggregateSeq, Value: []byte(fmt.Sprint(i + 1))},
		}})
	}
	insert := `INSERT INTO ` + table + ` (event_id, amount) VALUES ($1, $2)`
	cfg := consumertest.Config{
		DB:      db.Pool,
		Records: records,
		Seed:    42, // fixed here so that the output is too; leave it 0 in a test
		Reset: func(ctx context.Context, db *pgxpool.Pool) error {
			_, err := db.Exec(ctx, `TRUNCATE `+table)
			return err
		},
		Applied: func(ctx context.Context, db *pgxpool.Pool) ([]string, error) {
			rows, _ := db.Query(ctx, `SELECT event_id FROM `+table+` ORDER BY id`)
			return pgx.CollectRows(rows, pgx.RowTo[string])
		},
	}

	cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, insert, m.IdempotencyKey, string(m.Value))
		return err
	})
	fmt.Println("in its transaction:", consumertest.Check(ctx, cfg))

	cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := db.Pool.Exec(ctx, insert, m.IdempotencyKey, string(m.Value))
		return err
	})
	err = consumertest.Check(ctx, cfg)
	var f *consumertest.Failure
	fmt.Println("with the pool:", errors.As(err, &f) && strings.Contains(f.Problem, "write outside the transaction"))
	// Output:
	// in its transaction: <nil>
	// with the pool: true
}
