package operator_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/producer"
)

// An operator outside the consuming service replays every dead letter of
// a consumer that failed in its handler, once the fault is fixed: a
// request the running consumer carries out, with a count first and the
// outcome after.
func Example() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()

	// The consuming service: its handler fails until the fault is fixed.
	var fixed atomic.Bool
	p, err := consumer.Handle(db.Pool, "billing", consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
		if !fixed.Load() {
			return consumer.Permanent(errors.New("card processor down"))
		}
		return nil
	}), &consumer.Config{Schema: db.Schema, RequestPoll: 10 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	for seq := range int64(3) {
		r := producer.Record("orders", producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.changed"},
			producer.Stamp{EventID: fmt.Sprint("evt-", seq+1), Seq: seq + 1})
		r.Offset = seq
		_, err := p.Process(ctx, r)
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	serving, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = p.ServeRequests(serving) }() // Consumer.Run does this itself
	fixed.Store(true)

	// The operator, from a tool of their own: a dry run, then the request.
	filter := deadletter.ListOpts{Consumer: "billing", Status: deadletter.StatusDead, Reason: "handler"}
	reads, err := consumer.NewInspector(db.Pool, db.Schema)
	if err != nil {
		fmt.Println(err)
		return
	}
	preview, err := reads.PreviewLetters(ctx, &filter)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("would replay %d letters of %d aggregates, releasing %d parked records\n", preview.Letters, preview.Aggregates, preview.Parked)
	ops := operator.New(&operator.Config{Schema: db.Schema})
	id, err := ops.Submit(operator.WithActor(ctx, "alice"), db.Pool, &operator.Request{
		Consumer: "billing", Action: operator.Replay, Letters: filter, Rate: 100})
	if err != nil {
		fmt.Println(err)
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := ops.Wait(wctx, db.Pool, id, 10*time.Millisecond)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: applied %d, drained %d\n", r.Status, r.Progress.Applied, r.Progress.Drained)
	log, err := ops.Audit(ctx, db.Pool, &operator.AuditOpts{RequestID: id})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range log {
		fmt.Println(e.Actor, e.Action, e.Outcome, e.Detail)
	}
	// Output:
	// would replay 1 letters of 1 aggregates, releasing 2 parked records
	// done: applied 1, drained 2
	// alice replay applied drained 2
	// alice replay requested letters reason="handler" at 100/s
}
