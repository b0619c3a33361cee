package ordering_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/ordering"
)

// Sequence 3 arrives before 2: it is parked, and applied right after 2 in
// the same transaction.
func Example() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()
	tracker, err := ordering.New("shipping", &ordering.Config{Schema: db.Schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	order := ordering.Aggregate{Type: "order", ID: "o-42"}
	apply := func(seq int64) { fmt.Println("applied", seq) }

	for _, seq := range []int64{1, 3, 2, 2} {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			c, err := tracker.Check(ctx, tx, order, seq)
			if err != nil {
				return err
			}
			switch c.Verdict {
			case ordering.Duplicate:
				fmt.Println("duplicate", seq)
			case ordering.Gap:
				fmt.Println("parked", seq)
				_, err = tracker.Park(ctx, tx, order, seq, &kgo.Record{Topic: "orders"}, "")
			case ordering.InOrder:
				apply(seq)
				_, err = tracker.Drain(ctx, tx, order, 0, func(_ context.Context, p *ordering.Parked) error {
					apply(p.Seq)
					return nil
				})
			}
			return err
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	// Output:
	// applied 1
	// parked 3
	// applied 2
	// applied 3
	// duplicate 2
}
