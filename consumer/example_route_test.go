package consumer_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// A consumer that applies each record in the database that owns its
// aggregate: here two schemas stand for two regions' databases, and an
// order's id names its region. Each record's key, position and effect
// commit in its own target; a record no target owns is dead-lettered in
// the fallback target without running the handler.
func ExampleRoute() {
	ctx := context.Background()
	eu, closeEU, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeEU() }()
	us, closeUS, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeUS() }()
	for _, db := range []*pgtest.DB{eu, us} {
		if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{db.Schema, "shipments"}.Sanitize()+` (order_id text)`); err != nil {
			fmt.Println(err)
			return
		}
	}

	route := &consumer.Route{
		Targets: []consumer.Target{{Name: "eu", DB: eu.Pool, Schema: eu.Schema}, {Name: "us", DB: us.Pool, Schema: us.Schema}},
		Owner: func(_, id string) (string, error) {
			region, _, _ := strings.Cut(id, "-")
			return region, nil // "eu", "us", or a name no target has
		},
	}
	p, err := consumer.Handle(nil, "shipping", consumer.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			// tx is the owning target's: shipments is that schema's table
			// (the pool's search_path has no schema here, so say which).
			schema := eu.Schema
			if strings.HasPrefix(m.AggregateID, "us-") {
				schema = us.Schema
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "shipments"}.Sanitize()+` VALUES ($1)`, m.AggregateID)
			return err
		}), &consumer.Config{Route: route})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, id := range []string{"eu-1", "us-7", "eu-2", "mars-1"} {
		r := producer.Record("orders", producer.Event{AggregateType: "order", AggregateID: id, EventType: "order.paid"},
			producer.Stamp{EventID: "evt-" + id, Seq: 1})
		r.Offset = int64(i)
		res, err := p.Process(ctx, r)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: %s\n", id, res.Outcome)
	}
	for _, db := range []*pgtest.DB{eu, us} {
		rows, _ := db.Pool.Query(ctx, `SELECT order_id FROM `+pgx.Identifier{db.Schema, "shipments"}.Sanitize()+` ORDER BY order_id`)
		ids, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		fmt.Println(ids)
	}
	letters, _ := p.Target("eu").Inspector().Letters(ctx, &deadletter.ListOpts{Consumer: "shipping"})
	fmt.Println(len(letters), "letter in the fallback target")
	// Output:
	// eu-1: applied
	// us-7: applied
	// eu-2: applied
	// mars-1: dead_lettered
	// [eu-1 eu-2]
	// [us-7]
	// 1 letter in the fallback target
}
