package letters_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/letters"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/internal/tables"
)

// A letter is put, listed and discarded.
// consumer.Processor's Replay and Discard do the same and also re-apply the
// record or release the records parked behind it.
func Example() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()
	store := letters.New(tables.For(db.Schema).DeadLetters)
	// A letter is put in the transaction that gives up on its record.
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := store.Put(ctx, tx, &deadletter.Letter{
			Consumer: "billing",
			Record:   &kgo.Record{Topic: "orders", Partition: 0, Offset: 17, Key: []byte("o-9"), Value: []byte(`{"total":-1}`)},
			Error:    "negative total",
			Attempts: 5,
		})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	open, err := store.List(ctx, db.Pool, &deadletter.ListOpts{Consumer: "billing", Status: deadletter.StatusDead})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, l := range open {
		fmt.Printf("%s/%d@%d: %s after %d attempts: %s\n", l.Record.Topic, l.Record.Partition, l.Record.Offset, l.Error, l.Attempts, l.Record.Value)
		if err := store.Discard(ctx, db.Pool, l.ID, nil); err != nil {
			fmt.Println(err)
			return
		}
	}
	got, _ := store.Get(ctx, db.Pool, open[0].ID)
	fmt.Println(got.Status)
	// Output:
	// orders/0@17: negative total after 5 attempts: {"total":-1}
	// discarded
}
