package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/ordering"
	"github.com/d419a114/outbox/producer"
)

// publisher is a handler that consumes, applies and publishes: it writes
// the message's effect (a row in effects' table) and then one outbox event
// about it with producer.Write, both in the tx the SDK hands it, so that the
// event commits or rolls back with the effect and the message's key. It can
// fail after its Write, to show that a rolled-back attempt leaves no event.
type publisher struct {
	*effects
	w *producer.Writer
	// to, when set before the handler runs, names the shipment a
	// message's event is about; default the message's own aggregate id.
	to func(*consumer.Message) string
	// wrote, when set before the handler runs, is called by Handle after
	// each Write that succeeded.
	wrote func(*consumer.Message)

	mu sync.Mutex
	// failAfter makes that many more runs that reach a key fail after
	// their Write; a negative count fails every run.
	failAfter map[string]int
	// writes counts the Write calls that succeeded, per input key,
	// whether or not their transaction committed.
	writes map[string]int
}

func newPublisher(t *testing.T, db *pgtest.DB) *publisher {
	t.Helper()
	return publisherOf(newEffects(t, db))
}

// publisherOf is a publisher that writes its effects with e, in e's schema.
func publisherOf(e *effects) *publisher {
	return &publisher{
		effects: e, w: producer.NewWriter(&producer.WriterConfig{Schema: e.db.Schema}),
		failAfter: map[string]int{}, writes: map[string]int{},
	}
}

// outgoing is the event p writes for m: about a shipment of the same id
// unless p.to says otherwise, keyed by m's key so that each input's event
// can be found.
func (p *publisher) outgoing(m *consumer.Message) producer.Event {
	to := m.AggregateID
	if p.to != nil {
		to = p.to(m)
	}
	return producer.Event{
		AggregateType: "shipment", AggregateID: to, EventType: "shipment.requested",
		Payload: []byte(m.IdempotencyKey), IdempotencyKey: "out:" + m.IdempotencyKey,
	}
}

func (p *publisher) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if err := p.effects.Handle(ctx, tx, m); err != nil {
		return err
	}
	if _, err := p.w.Write(ctx, tx, p.outgoing(m)); err != nil {
		return err
	}
	if p.wrote != nil {
		p.wrote(m)
	}
	return p.afterWrite(m)
}

// afterWrite counts the Write for ms and fails when one of them is to.
func (p *publisher) afterWrite(ms ...*consumer.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range ms {
		p.writes[m.IdempotencyKey]++
	}
	for _, m := range ms {
		switch n := p.failAfter[m.IdempotencyKey]; {
		case n < 0:
			return errors.New("shipping refuses " + m.IdempotencyKey)
		case n > 0:
			p.failAfter[m.IdempotencyKey] = n - 1
			return errors.New("shipping hiccup for " + m.IdempotencyKey)
		}
	}
	return nil
}

func (p *publisher) setFailAfter(key string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failAfter[key] = n
}

func (p *publisher) writesOf(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.writes[key]
}

// batchPublisher is publisher as a BatchHandler: the batch's effects with
// one statement and all its events with one Write call, which numbers each
// shipment's events in message order, as Handle for each would.
type batchPublisher struct{ *publisher }

func (p batchPublisher) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	if err := (batchEffects{p.effects}).HandleBatch(ctx, tx, ms); err != nil {
		return err
	}
	events := make([]producer.Event, len(ms))
	for i, m := range ms {
		events[i] = p.outgoing(m)
	}
	if _, err := p.w.Write(ctx, tx, events...); err != nil {
		return err
	}
	return p.afterWrite(ms...)
}

// handler returns p as the handler of md.
func (p *publisher) handler(md mode) consumer.Handler {
	if md.batchHandler {
		return batchPublisher{p}
	}
	return p
}

// outbox returns the events in the outbox: how many there are per input
// key (the key of the message whose handler wrote them), and the input keys
// of each shipment in the order of the sequence Write gave them.
func (p *publisher) outbox(t *testing.T) (count map[string]int, bySeq map[string][]string) {
	t.Helper()
	rows, err := p.db.Pool.Query(context.Background(), `SELECT idempotency_key, aggregate_id, aggregate_seq FROM `+
		p.db.Table("events")+` WHERE aggregate_type = 'shipment' ORDER BY aggregate_id, aggregate_seq`)
	require.NoError(t, err)
	count, bySeq = map[string]int{}, map[string][]string{}
	var (
		key, agg string
		seq      int64
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &agg, &seq}, func() error {
		in := key[len("out:"):]
		count[in]++
		bySeq[agg] = append(bySeq[agg], in)
		if want := int64(len(bySeq[agg])); seq != want {
			return fmt.Errorf("shipment %s: event of %s has sequence %d, want %d (no hole from 1)", agg, in, seq, want)
		}
		return nil
	})
	require.NoError(t, err)
	return count, bySeq
}

// once is the outbox count that says each of keys has exactly one event.
func once(keys ...string) map[string]int {
	m := make(map[string]int, len(keys))
	for _, k := range keys {
		m[k] = 1
	}
	return m
}

// TestHandlersThatPublish proves consume, apply, publish: a handler that
// writes outbox events with producer.Write in the transaction the SDK
// hands it publishes each input's event exactly once, in single mode, in
// batch mode through Handle and in batch mode through HandleBatch, whatever
// the input does: redelivered, failing after the Write and then
// succeeding, poison, parked and drained, replayed.
func TestHandlersThatPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T, md mode) (*consumer.Processor, *publisher, *pgtest.DB) {
		t.Helper()
		db := pgtest.New(t, nil)
		pub := newPublisher(t, db)
		p, err := consumer.Handle(db.Pool, "shipping", pub.handler(md), fastConfig(db, md.batch))
		require.NoError(t, err)
		return p, pub, db
	}

	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()

			// Every applied input has its event, and each shipment's
			// events are numbered in the order of its inputs.
			t.Run("EachInputPublishesOnce", func(t *testing.T) {
				t.Parallel()
				p, pub, _ := setup(t, md)
				res := processAll(t, p, md.batch, rec("a", 1, "a1"), rec("b", 1, "b1"), rec("a", 2, "a2"),
					rec("b", 2, "b2"), rec("a", 3, "a3"), rec("c", 0, "c-unsequenced"))
				for _, r := range res {
					require.Equal(t, consumer.Applied, r.Outcome)
				}
				count, bySeq := pub.outbox(t)
				require.Equal(t, once("a1", "a2", "a3", "b1", "b2", "c-unsequenced"), count)
				require.Equal(t, map[string][]string{"a": {"a1", "a2", "a3"}, "b": {"b1", "b2"}, "c": {"c-unsequenced"}}, bySeq)
				if md.batchHandler {
					require.Equal(t, [][]string{{"a1", "b1", "a2", "b2", "a3", "c-unsequenced"}}, pub.batchKeys(), "one HandleBatch wrote them all")
				}
			})

			// A redelivered input is a duplicate: its handler does not run
			// again, so nothing more is published, within a batch or after.
			t.Run("RedeliveryPublishesNothingMore", func(t *testing.T) {
				t.Parallel()
				p, pub, _ := setup(t, md)
				res := processAll(t, p, md.batch, rec("a", 1, "a1"), rec("a", 1, "a1"), rec("a", 2, "a2"), rec("b", 0, "b-unsequenced"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Duplicate, consumer.Applied, consumer.Applied}, outcomes(res))
				res = processAll(t, p, md.batch, rec("a", 2, "a2"), rec("a", 1, "a1"), rec("b", 0, "b-unsequenced"))
				require.Equal(t, []consumer.Outcome{consumer.Duplicate, consumer.Duplicate, consumer.Duplicate}, outcomes(res))
				count, bySeq := pub.outbox(t)
				require.Equal(t, once("a1", "a2", "b-unsequenced"), count)
				require.Equal(t, []string{"a1", "a2"}, bySeq["a"])
				for _, k := range []string{"a1", "a2", "b-unsequenced"} {
					require.Equal(t, 1, pub.writesOf(k), "%s: written once, by the one run that applied it", k)
				}
			})

			// A handler that fails after its Write rolls the event back
			// with its effect: the attempt that finally commits leaves the
			// only event, and its sequence has no hole where the rolled
			// back ones were numbered.
			t.Run("FailureAfterWriteLeavesNoEvent", func(t *testing.T) {
				t.Parallel()
				p, pub, _ := setup(t, md)
				pub.setFailAfter("a2", 2) // MaxAttempts is 3: the third run commits
				res := processAll(t, p, md.batch, rec("a", 1, "a1"), rec("a", 2, "a2"), rec("a", 3, "a3"), rec("b", 1, "b1"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.Applied, consumer.Applied}, outcomes(res))
				require.Equal(t, 3, pub.writesOf("a2"), "a2's event was written three times, and rolled back twice")
				if md.batch > 1 {
					require.GreaterOrEqual(t, pub.writesOf("a1"), 2, "a1's event was written in the batch that rolled back")
				}
				count, bySeq := pub.outbox(t)
				require.Equal(t, once("a1", "a2", "a3", "b1"), count)
				require.Equal(t, []string{"a1", "a2", "a3"}, bySeq["a"])
				rows, distinct := pub.count(t)
				require.Equal(t, 4, rows)
				require.Equal(t, 4, distinct)
			})

			// A poison input is dead-lettered with no event, holds its
			// aggregate (its successor parks, with no event either) and
			// lets the others publish; in batch mode its batch falls back
			// and the good records' events are there once. Replayed after a
			// fix, it publishes its event and its successor's, once.
			t.Run("PoisonPublishesNothing", func(t *testing.T) {
				t.Parallel()
				p, pub, _ := setup(t, md)
				pub.setFailAfter("p1", -1)
				res := processAll(t, p, md.batch, rec("a", 1, "a1"), rec("p", 1, "p1"), rec("b", 1, "b1"),
					rec("p", 2, "p2"), rec("a", 2, "a2"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.DeadLettered, consumer.Applied,
					consumer.Parked, consumer.Applied}, outcomes(res))
				require.GreaterOrEqual(t, pub.writesOf("p1"), 3, "p1's event was written by every attempt")
				count, _ := pub.outbox(t)
				require.Equal(t, once("a1", "a2", "b1"), count)

				pub.setFailAfter("p1", 0)
				r, err := p.Replay(ctx, res[1].DeadLetterID)
				require.NoError(t, err)
				require.Equal(t, consumer.Applied, r.Outcome)
				require.Equal(t, 1, r.Drained)
				count, bySeq := pub.outbox(t)
				require.Equal(t, once("a1", "a2", "b1", "p1", "p2"), count)
				require.Equal(t, []string{"p1", "p2"}, bySeq["p"])
			})

			// Records parked behind a gap publish when they are drained,
			// each in a savepoint of the transaction that fills the gap: a
			// drained record that fails after its Write once is rolled back
			// to its savepoint, event included, and then applied once.
			t.Run("DrainedRecordsPublishOnce", func(t *testing.T) {
				t.Parallel()
				p, pub, _ := setup(t, md)
				pub.setFailAfter("a3", 1)
				res := processAll(t, p, md.batch, rec("a", 3, "a3"), rec("a", 2, "a2"), rec("b", 1, "b1"), rec("a", 1, "a1"))
				require.Equal(t, []consumer.Outcome{consumer.Parked, consumer.Parked, consumer.Applied, consumer.Applied}, outcomes(res))
				require.Equal(t, 2, res[3].Drained)
				require.Equal(t, 2, pub.writesOf("a3"))
				count, bySeq := pub.outbox(t)
				require.Equal(t, once("a1", "a2", "a3", "b1"), count)
				require.Equal(t, []string{"a1", "a2", "a3"}, bySeq["a"], "drained in sequence order")
				require.Equal(t, []int64{1, 2, 3}, pub.seqs(t, "a"))
			})

			// ResolveGap drains in the operator's transaction: the records
			// it releases publish too.
			t.Run("ResolveGapPublishes", func(t *testing.T) {
				t.Parallel()
				p, pub, _ := setup(t, md)
				res := processAll(t, p, md.batch, rec("a", 1, "a1"), rec("a", 3, "a3"), rec("a", 4, "a4"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Parked, consumer.Parked}, outcomes(res))
				n, err := p.ResolveGap(ctx, ordering.Aggregate{Type: "order", ID: "a"})
				require.NoError(t, err)
				require.Equal(t, 2, n)
				count, bySeq := pub.outbox(t)
				require.Equal(t, once("a1", "a3", "a4"), count)
				require.Equal(t, []string{"a1", "a3", "a4"}, bySeq["a"])
			})

			// The relay publishes what the handlers committed, once each,
			// in each shipment's order, and nothing that rolled back.
			t.Run("RelayPublishesWhatCommitted", func(t *testing.T) {
				t.Parallel()
				p, pub, db := setup(t, md)
				pub.setFailAfter("a2", 1)
				pub.setFailAfter("p1", -1)
				res := processAll(t, p, md.batch, rec("a", 1, "a1"), rec("a", 2, "a2"), rec("p", 1, "p1"),
					rec("a", 1, "a1"), rec("b", 1, "b1"), rec("a", 3, "a3"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.DeadLettered,
					consumer.Duplicate, consumer.Applied, consumer.Applied}, outcomes(res))

				broker := kafkatest.New(t)
				topic := broker.Topic(t, 3)
				relay, err := producer.NewRelay(db.Pool, broker.Client(t), &producer.RelayConfig{Schema: db.Schema, Topic: topic, Logger: quietLogger})
				require.NoError(t, err)
				runCtx, stop := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- relay.Run(runCtx) }()
				got := broker.Records(t, topic, 4, 30*time.Second)
				stop()
				require.NoError(t, <-done)

				header := func(r *kgo.Record, name string) string {
					for _, h := range r.Headers {
						if h.Key == name {
							return string(h.Value)
						}
					}
					return ""
				}
				// At least once on the wire: keep each event's first copy.
				seen := map[string]bool{}
				bySeq := map[string][]string{}
				for _, r := range got {
					key := header(r, outbox.HeaderIdempotencyKey)
					if seen[key] {
						continue
					}
					seen[key] = true
					bySeq[string(r.Key)] = append(bySeq[string(r.Key)], string(r.Value))
				}
				require.Equal(t, map[string][]string{"a": {"a1", "a2", "a3"}, "b": {"b1"}}, bySeq)
			})

			// The same through the runner, which in batch mode also puts a
			// small poll of several partitions in one transaction: every
			// record delivered twice, one failing once after its Write, one
			// poison. Each applied input's event is there once, in order.
			t.Run("ConsumerGroupPublishes", func(t *testing.T) {
				t.Parallel()
				b := newGroupBundle(t, 3)
				pub := publisherOf(b.effects)
				pub.setFailAfter("agg-1-3", 1)
				pub.setFailAfter("agg-2-5", -1)
				b.produce(t, stream(6, 60)...)
				b.produce(t, stream(6, 60)...)
				b.start(t, pub.handler(md), fastConfig(b.db, md.batch))
				eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == 120 }, "all offsets committed")

				want := map[string][]string{}
				var keys []string
				for seq := 1; seq <= 10; seq++ {
					for a := range 6 {
						if a == 2 && seq >= 5 {
							continue // the poison and the records parked behind it
						}
						agg := fmt.Sprintf("agg-%d", a)
						key := fmt.Sprintf("%s-%d", agg, seq)
						want[agg] = append(want[agg], key)
						keys = append(keys, key)
					}
				}
				count, bySeq := pub.outbox(t)
				require.Equal(t, once(keys...), count)
				require.Equal(t, want, bySeq)
				require.GreaterOrEqual(t, pub.writesOf("agg-1-3"), 2)
				require.GreaterOrEqual(t, pub.writesOf("agg-2-5"), 3)
			})
		})
	}
}

// TestPublishingBatchesThatDeadlock: Write locks the sequence row of each
// aggregate it writes until the transaction ends, and in batch mode that is
// the batch's commit. So two partitions' batches whose handlers write the
// same shipments in opposite orders deadlock:
//
//  1. batch A writes x1's event about shipment X and holds X's row;
//  2. batch B writes y1's event about shipment Y and holds Y's row;
//  3. A writes x2's event about Y and waits for B; B writes y2's about X
//     and waits for A.
//
// PostgreSQL aborts one of them (40P01). That is no record's fault: the
// aborted batch is rolled back, events included, and its records are run
// one by one once the other batch commits; nothing is dead-lettered and
// each input's event exists once.
func TestPublishingBatchesThatDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	pub := newPublisher(t, db)
	shipment := map[string]string{"x1": "X", "x2": "Y", "y1": "Y", "y2": "X"}
	pub.to = func(m *consumer.Message) string { return shipment[m.IdempotencyKey] }
	// Steps 1 and 2 happen before step 3: each batch's first Write waits
	// for the other's, once.
	var (
		mu       sync.Mutex
		arrived  int
		timedOut bool
		both     = make(chan struct{})
	)
	pub.wrote = func(m *consumer.Message) {
		if m.IdempotencyKey != "x1" && m.IdempotencyKey != "y1" {
			return
		}
		mu.Lock()
		arrived++
		if arrived == 2 {
			close(both)
		}
		first := arrived <= 2
		mu.Unlock()
		if !first {
			return
		}
		select {
		case <-both:
		case <-time.After(30 * time.Second):
			mu.Lock()
			timedOut = true
			mu.Unlock()
		}
	}
	p, err := consumer.Handle(db.Pool, "shipping", pub, fastConfig(db, 2))
	require.NoError(t, err)

	batch := func(partition int32, recs ...*kgo.Record) []*kgo.Record {
		for _, r := range recs {
			r.Topic, r.Partition, r.Offset = "orders", partition, nextOffset.Add(1)
		}
		return recs
	}
	batches := [][]*kgo.Record{
		batch(0, rec("x", 1, "x1"), rec("x", 2, "x2")),
		batch(1, rec("y", 1, "y1"), rec("y", 2, "y2")),
	}
	type result struct {
		res []consumer.Result
		err error
	}
	results := make(chan result, len(batches))
	for _, b := range batches {
		go func() {
			res, err := p.ProcessBatch(ctx, b)
			results <- result{res, err}
		}()
	}
	for range batches {
		r := <-results
		require.NoError(t, r.err)
		require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied}, outcomes(r.res))
	}
	mu.Lock()
	require.False(t, timedOut, "the two batches did not run side by side")
	mu.Unlock()
	require.Equal(t, 3, pub.writesOf("x1")+pub.writesOf("y1"), "one batch was aborted after its first Write and run again")
	count, _ := pub.outbox(t)
	require.Equal(t, once("x1", "x2", "y1", "y2"), count)
}
