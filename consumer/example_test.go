package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// Handle inside a poll loop you already have: each record is applied in
// its own transaction with its key claimed and its sequence checked, so a
// duplicate is skipped and an early record waits for its predecessor.
func ExampleHandle() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()
	shipments := pgx.Identifier{db.Schema, "shipments"}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+shipments+` (order_id text, step text)`); err != nil {
		fmt.Println(err)
		return
	}

	p, err := consumer.Handle(db.Pool, "shipping", consumer.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+shipments+` VALUES ($1, $2)`, m.AggregateID, m.Value)
			return err
		}), &consumer.Config{Schema: db.Schema})
	if err != nil {
		fmt.Println(err)
		return
	}

	record := func(offset, seq int64, step string) *kgo.Record {
		r := producer.Record("orders", producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order." + step, Payload: []byte(step)},
			producer.Stamp{EventID: fmt.Sprint("evt-", seq), Seq: seq})
		r.Offset = offset
		return r
	}
	// As a poll loop might see them: 2 before 1, and 1 twice.
	for _, r := range []*kgo.Record{record(0, 2, "packed"), record(1, 1, "paid"), record(2, 1, "paid")} {
		res, err := p.Process(ctx, r)
		if err != nil {
			fmt.Println(err) // not done: do not commit its offset
			return
		}
		fmt.Printf("offset %d: %s (drained %d)\n", r.Offset, res.Outcome, res.Drained)
	}
	rows, _ := db.Pool.Query(ctx, `SELECT step FROM `+shipments)
	steps, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	fmt.Println(steps)
	// Output:
	// offset 0: parked (drained 0)
	// offset 1: applied (drained 1)
	// offset 2: duplicate (drained 0)
	// [paid packed]
}

// A handler that publishes: consume a record, apply its effect and write
// the events it causes with producer.Write, all in the transaction the SDK
// hands the handler. The events commit with the effect and the record's
// key, or roll back with them: a redelivery publishes nothing more, and a
// failed attempt leaves no event behind. A producer.Relay on this database
// then publishes what committed. The same handler works with ProcessBatch
// and Config.BatchSize, and a BatchHandler can write a batch's events with
// one Write call.
func ExampleHandle_publish() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()
	reservations := pgx.Identifier{db.Schema, "reservations"}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+reservations+` (order_id text PRIMARY KEY)`); err != nil {
		fmt.Println(err)
		return
	}

	// The outbox lives in the consumer's own database, here in the same
	// schema as the consumer's tables.
	w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
	busy := true // the first try of o-2 fails after its Write
	p, err := consumer.Handle(db.Pool, "warehouse", consumer.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+reservations+` VALUES ($1)`, m.AggregateID); err != nil {
				return err
			}
			_, err := w.Write(ctx, tx, producer.Event{
				AggregateType: "shipment", AggregateID: m.AggregateID, EventType: "shipment.requested",
				Payload: m.Value,
				// Derived from the input's key, so that consumers of
				// shipments can tell this event from any other.
				IdempotencyKey: "shipment-for-" + m.IdempotencyKey,
			})
			if err != nil {
				return err
			}
			if m.AggregateID == "o-2" && busy {
				busy = false
				return errors.New("carrier busy") // rolls back the reservation and the event
			}
			return nil
		}), &consumer.Config{Schema: db.Schema, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond, Logger: quietLogger})
	if err != nil {
		fmt.Println(err)
		return
	}

	record := func(offset int64, order string) *kgo.Record {
		r := producer.Record("orders", producer.Event{AggregateType: "order", AggregateID: order, EventType: "order.paid", Payload: []byte(order + " paid")},
			producer.Stamp{EventID: "paid-" + order, Seq: 1})
		r.Offset = offset
		return r
	}
	// o-1 arrives twice; o-2's first try fails.
	for i, r := range []*kgo.Record{record(0, "o-1"), record(1, "o-1"), record(2, "o-2")} {
		res, err := p.Process(ctx, r)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("offset %d: %s after %d attempts\n", i, res.Outcome, res.Attempts)
	}

	rows, err := db.Pool.Query(ctx, `SELECT aggregate_id, aggregate_seq, idempotency_key, payload FROM `+
		pgx.Identifier{db.Schema, "events"}.Sanitize()+` ORDER BY id`)
	if err != nil {
		fmt.Println(err)
		return
	}
	var (
		id, key string
		seq     int64
		payload []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &seq, &key, &payload}, func() error {
		fmt.Printf("outbox: shipment %s seq %d, key %s: %s\n", id, seq, key, payload)
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// offset 0: applied after 1 attempts
	// offset 1: duplicate after 0 attempts
	// offset 2: applied after 2 attempts
	// outbox: shipment o-1 seq 1, key shipment-for-paid-o-1: o-1 paid
	// outbox: shipment o-2 seq 1, key shipment-for-paid-o-2: o-2 paid
}

// New runs a consumer group: records applied once, offsets committed after
// the database commit. With Concurrency 4 up to four aggregates of a
// partition are applied at once; the records here are all of aggregate
// o-1 (their key), so they still go one after another in offset order.
func ExampleNew() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()

	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer producer.Close()
	for i, id := range []string{"evt-1", "evt-2", "evt-1"} { // evt-1 delivered twice
		r := &kgo.Record{Key: []byte("o-1"), Value: []byte(fmt.Sprint("payload ", i)),
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte(id)}}}
		if err := producer.ProduceSync(ctx, r).FirstErr(); err != nil {
			fmt.Println(err)
			return
		}
	}

	client, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}, consumer.ClientOpts()...)...)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	seen := make(chan string, 3)
	c, err := consumer.New(db.Pool, client, "billing", consumer.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			seen <- m.IdempotencyKey + ": " + string(m.Value)
			return nil
		}), &consumer.Config{Schema: db.Schema, Concurrency: 4, Logger: quietLogger})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	for range 2 {
		select {
		case s := <-seen:
			fmt.Println(s)
		case <-time.After(30 * time.Second):
			fmt.Println("timed out")
		}
	}
	stop()
	fmt.Println("run:", <-done)
	// Output:
	// evt-1: payload 0
	// evt-2: payload 1
	// run: <nil>
}

// On a share group (Kafka 4.2 and later) the broker hands one
// partition's records to many members, in no order, so New takes only a
// handler that says it needs none (Config.Unordered). Each record is still
// applied once: the second copy of evt-1 is skipped by its key and
// accepted.
func ExampleNew_shareGroup() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "emails"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("emails"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	// A share group starts at the latest record unless told otherwise.
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, "mailer"
	for k, v := range map[string]string{"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "5"} {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Op, c.Value = k, kmsg.IncrementalAlterConfigOpSet, &v
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	if _, err := req.RequestWith(ctx, cl); err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range []string{"evt-1", "evt-2", "evt-1"} {
		r := &kgo.Record{Key: []byte("u-1"), Value: []byte("welcome"), Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte(id)}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			fmt.Println(err)
			return
		}
	}

	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ShareGroup("mailer"), kgo.ConsumeTopics("emails"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error { return nil })
	if _, err := consumer.New(db.Pool, client, "mailer", h, &consumer.Config{Schema: db.Schema}); err != nil {
		fmt.Println("ordered:", strings.Contains(err.Error(), "set Config.Unordered"))
	}
	outcomes := make(chan string, 3)
	c, err := consumer.New(db.Pool, client, "mailer", h, &consumer.Config{Schema: db.Schema, Unordered: true, Concurrency: 8,
		Tracer: endFunc(func(r consumer.Result) { outcomes <- r.Outcome.String() }), Logger: quietLogger})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	counts := map[string]int{}
	for range 3 {
		select {
		case o := <-outcomes:
			counts[o]++
		case <-time.After(30 * time.Second):
			fmt.Println("timed out")
		}
	}
	stop()
	fmt.Println("applied:", counts["applied"], "duplicate:", counts["duplicate"])
	fmt.Println("run:", <-done)
	// Output:
	// ordered: true
	// applied: 2 duplicate: 1
	// run: <nil>
}

// endFunc is a consumer.Tracer that passes each outcome to a function.
type endFunc func(consumer.Result)

func (endFunc) TraceRecordStart(ctx context.Context, _ *kgo.Record) context.Context { return ctx }

func (f endFunc) TraceRecordEnd(_ context.Context, _ *kgo.Record, res consumer.Result, err error) {
	if err == nil {
		f(res)
	}
}

// A record whose handler keeps failing is dead-lettered and holds its
// aggregate; once the cause is fixed, Replay applies it once and releases
// the records parked behind it, in order.
func ExampleProcessor_Replay() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()

	broken := true
	p, err := consumer.Handle(db.Pool, "invoicing", consumer.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if broken {
				return errors.New("tax service unavailable")
			}
			fmt.Printf("applied %s seq %d\n", m.AggregateID, m.Seq)
			return nil
		}), &consumer.Config{Schema: db.Schema, MaxAttempts: 2, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond, Logger: quietLogger})
	if err != nil {
		fmt.Println(err)
		return
	}
	record := func(offset, seq int64) *kgo.Record {
		r := producer.Record("orders", producer.Event{AggregateType: "order", AggregateID: "o-7", EventType: "order.changed"},
			producer.Stamp{EventID: fmt.Sprint("evt-", seq), Seq: seq})
		r.Offset = offset
		return r
	}
	var letter int64
	for i, seq := range []int64{1, 2} {
		res, err := p.Process(ctx, record(int64(i), seq))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("seq %d: %s after %d attempts\n", seq, res.Outcome, res.Attempts)
		if res.Outcome == consumer.DeadLettered {
			letter = res.DeadLetterID
		}
	}

	broken = false
	res, err := p.Replay(ctx, letter)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("replay: %s, drained %d\n", res.Outcome, res.Drained)
	// Output:
	// seq 1: dead_lettered after 2 attempts
	// seq 2: parked after 0 attempts
	// applied o-7 seq 1
	// applied o-7 seq 2
	// replay: applied, drained 1
}

// ledger books one row per message. Its HandleBatch books a whole batch
// with one statement, which is what makes batch mode fast: the effect is
// the same as Handle's for each message in order.
type ledger struct{ table string }

var _ consumer.BatchHandler = ledger{}

func (l ledger) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+l.table+` (event_id, account, amount) VALUES ($1, $2, $3)`,
		m.IdempotencyKey, m.AggregateID, string(m.Value))
	return err
}

func (l ledger) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	ids, accounts, amounts := make([]string, len(ms)), make([]string, len(ms)), make([]string, len(ms))
	for i, m := range ms {
		ids[i], accounts[i], amounts[i] = m.IdempotencyKey, m.AggregateID, string(m.Value)
	}
	fmt.Printf("HandleBatch: %d messages\n", len(ms))
	_, err := tx.Exec(ctx, `INSERT INTO `+l.table+` (event_id, account, amount)
SELECT * FROM unnest($1::text[], $2::text[], $3::numeric[])`, ids, accounts, amounts)
	return err
}

// A BatchHandler in batch mode: the batch's fresh messages are booked with
// one statement, in the transaction that claims their keys and moves their
// aggregates; the duplicate is left out.
func ExampleBatchHandler() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = closeDB() }()
	l := ledger{table: pgx.Identifier{db.Schema, "ledger"}.Sanitize()}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+l.table+` (event_id text PRIMARY KEY, account text, amount numeric)`); err != nil {
		fmt.Println(err)
		return
	}
	p, err := consumer.Handle(db.Pool, "booking", l, &consumer.Config{Schema: db.Schema, BatchSize: 100})
	if err != nil {
		fmt.Println(err)
		return
	}

	record := func(offset int64, account string, seq int64, amount string) *kgo.Record {
		r := producer.Record("payments", producer.Event{AggregateType: "account", AggregateID: account, EventType: "account.moved", Payload: []byte(amount)},
			producer.Stamp{EventID: fmt.Sprintf("%s-%d", account, seq), Seq: seq})
		r.Offset = offset
		return r
	}
	recs := []*kgo.Record{record(0, "a", 1, "10"), record(1, "b", 1, "5"), record(2, "a", 2, "-3"), record(3, "a", 1, "10")}
	res, err := p.ProcessBatch(ctx, recs)
	if err != nil {
		fmt.Println(err) // recs[len(res):] are not done: do not commit them
		return
	}
	for i, r := range res {
		fmt.Printf("offset %d: %s\n", recs[i].Offset, r.Outcome)
	}
	var balance string
	if err := db.Pool.QueryRow(ctx, `SELECT sum(amount)::text FROM `+l.table+` WHERE account = 'a'`).Scan(&balance); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("balance of a:", balance)
	// Output:
	// HandleBatch: 3 messages
	// offset 0: applied
	// offset 1: applied
	// offset 2: applied
	// offset 3: duplicate
	// balance of a: 7
}
