package dedupe_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/dedupe"
	"github.com/d419a114/outbox/internal/pgtest"
)

// A payment webhook may arrive more than once. Claiming its id in the same
// transaction as the effect applies the effect once, without Kafka.
func Example() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()
	_, err = db.Pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{db.Schema, "payments"}.Sanitize()+` (id text, amount int)`)
	if err != nil {
		fmt.Println(err)
		return
	}

	store, err := dedupe.New("billing", &dedupe.Config{Schema: db.Schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	apply := func(webhookID string, amount int) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			fresh, err := store.Claim(ctx, tx, webhookID)
			if err != nil || !fresh {
				fmt.Printf("%s: duplicate, skipped\n", webhookID)
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{db.Schema, "payments"}.Sanitize()+` VALUES ($1, $2)`, webhookID, amount)
			fmt.Printf("%s: applied\n", webhookID)
			return err
		})
	}
	for _, id := range []string{"wh_1", "wh_2", "wh_1"} {
		if err := apply(id, 100); err != nil {
			fmt.Println(err)
			return
		}
	}
	var total int
	_ = db.Pool.QueryRow(ctx, `SELECT sum(amount) FROM `+pgx.Identifier{db.Schema, "payments"}.Sanitize()).Scan(&total)
	fmt.Println("total:", total)
	// Output:
	// wh_1: applied
	// wh_2: applied
	// wh_1: duplicate, skipped
	// total: 200
}
