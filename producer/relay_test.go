package producer_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

func TestRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PublishesCommittedEventsWithTheWireContract", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 4)
		e := b.event("a-1")
		e.ContentType = "application/json"
		e.Headers = map[string]string{"traceparent": "00-abc-def-01"}
		e.Payload = []byte(`{"z":1,"a":2}`)
		written := b.write(t, e, b.event("a-1"), b.event("a-2"))

		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = b.writer.Write(ctx, tx, b.event("rolled-back"))
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))

		b.startRelay(t, nil)
		b.waitDelivered(t, 30*time.Second)
		records := b.broker.Records(t, b.topic, 3, 30*time.Second)
		require.Len(t, records, 3)
		for _, r := range records {
			require.NotEqual(t, "rolled-back", string(r.Key), "a rolled-back event reached the topic")
		}
		checkOrder(t, records)

		var first *kgo.Record
		for _, r := range records {
			if id, _ := header(r, outbox.HeaderEventID); id == written[0].EventID {
				first = r
			}
		}
		require.NotNil(t, first)
		require.Equal(t, "a-1", string(first.Key))
		require.Equal(t, `{"z":1,"a":2}`, string(first.Value))
		want := map[string]string{
			outbox.HeaderEventType:      "funds.moved",
			outbox.HeaderAggregateType:  "account",
			outbox.HeaderAggregateID:    "a-1",
			outbox.HeaderAggregateSeq:   "1",
			outbox.HeaderIdempotencyKey: written[0].EventID,
			outbox.HeaderContentType:    "application/json",
			"traceparent":               "00-abc-def-01",
		}
		for k, v := range want {
			got, ok := header(first, k)
			require.True(t, ok, "header %s missing", k)
			require.Equal(t, v, got, "header %s", k)
		}
		at, ok := header(first, outbox.HeaderOccurredAt)
		require.True(t, ok)
		_, err = time.Parse(time.RFC3339Nano, at)
		require.NoError(t, err)
	})

	t.Run("WakesOnCommitWithoutPolling", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 1)
		b.startRelay(t, &producer.RelayConfig{PollInterval: time.Hour, RebalanceInterval: time.Hour})
		// The relay has taken its buckets and gone idle once its row says
		// so; from then on only a notification can wake it within the hour.
		waitFor(t, 30*time.Second, "relay idle", func() bool {
			var idle bool
			_ = b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+b.db.Table("relays")+` WHERE idle_until > now())`).Scan(&idle)
			return idle
		})
		for i := range 3 {
			b.write(t, b.event(aggName(i)))
			b.waitDelivered(t, 20*time.Second)
		}
	})

	t.Run("ListenerReconnects", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 1)
		b.startRelay(t, &producer.RelayConfig{PollInterval: time.Hour, RebalanceInterval: time.Hour, MinBackoff: 10 * time.Millisecond})
		listener := func() int {
			var pid int
			_ = b.db.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'`, b.appName).Scan(&pid)
			return pid
		}
		waitFor(t, 30*time.Second, "a listening session", func() bool { return listener() != 0 })
		old := listener()
		_, err := b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, old)
		require.NoError(t, err)
		waitFor(t, 30*time.Second, "a new listening session", func() bool { pid := listener(); return pid != 0 && pid != old })
		waitFor(t, 30*time.Second, "relay idle", func() bool {
			var idle bool
			_ = b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+b.db.Table("relays")+` WHERE idle_until > now())`).Scan(&idle)
			return idle
		})
		// With an hour-long poll, only the new session's notification can
		// bring this event out in time.
		b.write(t, b.event("a"))
		b.waitDelivered(t, 20*time.Second)
	})

	t.Run("PollCoversALostNotification", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 1)
		b.startRelay(t, &producer.RelayConfig{PollInterval: 100 * time.Millisecond, RebalanceInterval: time.Hour})
		// A row inserted with plain SQL rather than Write sends no
		// notification: only the poll can find it.
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO `+b.db.Table("events")+`
    (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, topic, payload)
VALUES (gen_random_uuid(), 'plain-sql', 'account', 'a', 1, 'funds.moved', $1, 'p')`, b.topic)
		require.NoError(t, err)
		b.waitDelivered(t, 20*time.Second)
	})

	t.Run("VisibilityGapLosesNothing", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 2)
		b.startRelay(t, &producer.RelayConfig{PollInterval: 50 * time.Millisecond})
		// The early transaction takes the lower id and commits last.
		early, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer early.Rollback(ctx)
		low, err := b.writer.Write(ctx, early, b.event("slow"))
		require.NoError(t, err)
		high := b.write(t, b.event("fast"))
		require.Greater(t, high[0].ID, low[0].ID)
		waitFor(t, 20*time.Second, "the higher id delivered", func() bool { return b.undelivered(t) == 0 })
		require.NoError(t, early.Commit(ctx))
		b.waitDelivered(t, 20*time.Second)
		records := b.broker.Records(t, b.topic, 2, 30*time.Second)
		require.Len(t, checkOrder(t, records), 2)
	})

	t.Run("SurvivesCancelsAndTerminatedConnections", func(t *testing.T) {
		t.Parallel()
		const total = 10000
		b := newBundle(t, 8)
		var events []producer.Event
		for i := range total {
			events = append(events, b.event(aggName(i%200)))
			if len(events) == 500 {
				b.write(t, events...)
				events = events[:0]
			}
		}
		cfg := &producer.RelayConfig{BatchSize: 200, Lease: 2 * time.Second, PublishTimeout: time.Second, PollInterval: 50 * time.Millisecond, RebalanceInterval: 100 * time.Millisecond}
		progress := func() int { return total - b.undelivered(t) }
		for round := range 6 {
			stop := b.startRelay(t, cfg)
			before := progress()
			waitFor(t, 60*time.Second, "some progress", func() bool { return progress() > before+200 || progress() == total })
			if round%2 == 0 {
				stop()
				continue
			}
			// Kill every session of the relay mid-flight, then stop it.
			_, err := b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, b.appName)
			require.NoError(t, err)
			stop()
		}
		b.startRelay(t, cfg)
		b.waitDelivered(t, 120*time.Second)
		records := b.broker.Records(t, b.topic, total, 60*time.Second)
		ids := checkOrder(t, records)
		require.Len(t, ids, total, "every event on the topic at least once")
	})

	t.Run("FailedMarkRepublishesAfterTheLease", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 2)
		// The first four attempts to mark rows delivered fail, as if the
		// database went away between the broker's ack and the mark: more
		// than the relay makes within half a lease, since its retries wait
		// at least half of the 100 ms backoff and half the lease is 150 ms,
		// so it gives up after at most three. A sequence counts them:
		// nextval survives the rollback.
		marks := b.failUpdates(t, "published_at", 4)
		var events []producer.Event
		for i := range 20 {
			events = append(events, b.event(aggName(i%5)))
		}
		b.write(t, events...)
		b.startRelay(t, &producer.RelayConfig{Lease: 300 * time.Millisecond, PublishTimeout: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond,
			MinBackoff: 100 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
		b.waitDelivered(t, 30*time.Second)
		require.Equal(t, int64(5), marks(), "four failed marks, then one that held")
		// A batch whose outcome could not be recorded stayed leased and was
		// published again after the lease: duplicates, in order, nothing
		// lost.
		records := b.broker.Records(t, b.topic, 40, 30*time.Second)
		require.GreaterOrEqual(t, len(records), 40, "published again after giving up")
		require.Len(t, checkOrder(t, records), 20)
	})

	t.Run("BrokerFaultsRetryWithoutLossOrReorder", func(t *testing.T) {
		t.Parallel()
		b := newFaultBundle(t, 4)
		fake := b.broker.Fake
		b.startRelay(t, &producer.RelayConfig{BatchSize: 50, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, PublishTimeout: 2 * time.Second, Lease: 5 * time.Second},
			kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond }),
			kgo.ProduceRequestTimeout(time.Second), kgo.RequestTimeoutOverhead(time.Second), kgo.MetadataMinAge(20*time.Millisecond))
		produce := []kmsg.Key{kmsg.Produce}
		failed := fake.Fault(kafkaFault(produce, kerr.NotLeaderForPartition, 20))
		lostAcks := fake.Fault(kafkaFault(produce, kerr.RequestTimedOut, 10))
		var drops atomic.Int32
		fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
			if drops.Add(1) > 5 {
				fake.DropControl()
				return nil, nil, false
			}
			fake.KeepControl()
			return nil, errConnDropped, true // closes the client's connection
		})
		const total = 1000
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := range total / 4 / 5 {
					var evs []producer.Event
					for range 5 {
						evs = append(evs, b.event(aggName((w*50+i)%40)))
					}
					b.write(t, evs...)
				}
			})
		}
		wg.Wait()
		b.waitDelivered(t, 120*time.Second)
		require.Positive(t, failed.Hits())
		require.Positive(t, lostAcks.Hits())
		require.Positive(t, drops.Load())
		records := b.broker.Records(t, b.topic, total, 60*time.Second)
		require.Len(t, checkOrder(t, records), total)
	})

	t.Run("PoisonEventGoesDeadHoldsItsAggregateAndReplays", func(t *testing.T) {
		t.Parallel()
		b := newFaultBundle(t, 4)
		poisonTopic := b.broker.Topic(t, 1)
		fault := b.broker.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: poisonTopic, Err: kerr.MessageTooLarge, Count: -1})
		b.startRelay(t, &producer.RelayConfig{MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, PollInterval: 20 * time.Millisecond})

		poison := b.event("sick")
		poison.Topic = poisonTopic
		b.write(t, poison)
		for i := range 3 {
			b.write(t, b.event("sick"), b.event(aggName(i)))
		}
		in, dead := inspector(t, b.db), deadEvents(t, b.db)
		var list []producer.DeadEvent
		waitFor(t, 30*time.Second, "the poison event dead", func() bool {
			var err error
			list, err = in.DeadEvents(ctx, &deadletter.ListOpts{Status: deadletter.StatusDead})
			require.NoError(t, err)
			return len(list) == 1
		})
		require.Equal(t, int64(1), list[0].Seq)
		require.Equal(t, 3, list[0].Attempts)
		require.Contains(t, list[0].Error, "MESSAGE_TOO_LARGE")
		require.True(t, list[0].Hold)

		// Other aggregates flow; the sick aggregate's later events wait.
		waitFor(t, 30*time.Second, "healthy aggregates delivered", func() bool { return b.undelivered(t) == 3 })
		h, err := in.Health(ctx)
		require.NoError(t, err)
		require.Equal(t, producer.Health{Undelivered: 3, Dead: 1, OldestUndelivered: h.OldestUndelivered, Dispatch: producer.DispatchRelay}, h)
		require.Positive(t, h.OldestUndelivered)

		fault.Remove() // the fix
		require.NoError(t, dead.Replay(ctx, b.db.Pool, list[0].ID))
		err = dead.Replay(ctx, b.db.Pool, list[0].ID)
		require.ErrorIs(t, err, deadletter.ErrResolved)
		require.ErrorContains(t, err, fmt.Sprintf("producer: replay dead event %d: it is replayed", list[0].ID))
		err = dead.Discard(ctx, b.db.Pool, list[0].ID+1000)
		require.ErrorIs(t, err, outbox.ErrNotFound)
		require.EqualError(t, err, fmt.Sprintf("producer: discard dead event %d: outbox: not found", list[0].ID+1000))
		b.waitDelivered(t, 30*time.Second)

		// The aggregate's events span two topics, so their order shows in
		// when each was acknowledged and marked, not in one topic.
		require.Equal(t, []int64{1, 2, 3, 4}, publishOrder(t, b, "sick"))
		require.Len(t, b.broker.Records(t, poisonTopic, 1, 30*time.Second), 1)
	})

	t.Run("HeldEventsNeverCrowdOutOtherAggregates", func(t *testing.T) {
		t.Parallel()
		b := newFaultBundle(t, 2)
		poisonTopic := b.broker.Topic(t, 1)
		b.broker.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: poisonTopic, Err: kerr.MessageTooLarge, Count: -1})
		poison := b.event("sick")
		poison.Topic = poisonTopic
		b.write(t, poison)
		var held []producer.Event
		for range 25 {
			held = append(held, b.event("sick"))
		}
		b.write(t, held...)
		b.startRelay(t, &producer.RelayConfig{BatchSize: 10, MaxAttempts: 2, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, PollInterval: 20 * time.Millisecond})
		in := inspector(t, b.db)
		waitFor(t, 30*time.Second, "the poison event dead", func() bool {
			h, err := in.Health(ctx)
			require.NoError(t, err)
			return h.Dead == 1
		})
		// More held events than a batch holds sit at the front of the id
		// order; a healthy aggregate written after them still goes out.
		b.write(t, b.event("healthy"))
		waitFor(t, 30*time.Second, "the healthy aggregate delivered", func() bool { return b.undelivered(t) == 25 })
	})

	t.Run("ReplayedEventThatDiesAgainGoesBackToDead", func(t *testing.T) {
		t.Parallel()
		b := newFaultBundle(t, 1)
		poisonTopic := b.broker.Topic(t, 1)
		b.broker.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: poisonTopic, Err: kerr.MessageTooLarge, Count: -1})
		poison := b.event("sick")
		poison.Topic = poisonTopic
		b.write(t, poison, b.event("sick"))
		b.startRelay(t, &producer.RelayConfig{MaxAttempts: 2, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, PollInterval: 20 * time.Millisecond})
		in, dead := inspector(t, b.db), deadEvents(t, b.db)
		deadOnes := func() []producer.DeadEvent {
			list, err := in.DeadEvents(ctx, &deadletter.ListOpts{Status: deadletter.StatusDead})
			require.NoError(t, err)
			return list
		}
		waitFor(t, 30*time.Second, "the poison event dead", func() bool { return len(deadOnes()) == 1 })
		id := deadOnes()[0].ID
		require.NoError(t, dead.Replay(ctx, b.db.Pool, id)) // without fixing the cause
		waitFor(t, 30*time.Second, "the replayed event dead again", func() bool { return len(deadOnes()) == 1 })
		require.Equal(t, id, deadOnes()[0].ID)
		require.Equal(t, 1, b.undelivered(t), "its successor is still held")
	})

	t.Run("UnrecordedFailureStillHoldsTheAggregate", func(t *testing.T) {
		t.Parallel()
		b := newFaultBundle(t, 1)
		poisonTopic := b.broker.Topic(t, 1)
		// The first publish to the poison topic fails, and recording that
		// failure fails too, for longer than the relay retries: the row is
		// left leased with no attempt counted.
		b.broker.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: poisonTopic, Err: kerr.MessageTooLarge})
		records := b.failUpdates(t, "attempts", 100)
		b.startRelay(t, &producer.RelayConfig{Lease: 300 * time.Millisecond, PublishTimeout: 200 * time.Millisecond, PollInterval: 20 * time.Millisecond,
			MinBackoff: 60 * time.Millisecond, MaxBackoff: 60 * time.Millisecond})
		first := b.event("k")
		first.Topic = poisonTopic
		b.write(t, first)
		waitFor(t, 30*time.Second, "recording the failure to fail", func() bool { return records() >= 1 })
		// seq 2 commits while seq 1 is leased but unacknowledged.
		b.write(t, b.event("k"))
		b.waitDelivered(t, 30*time.Second)
		require.Equal(t, []int64{1, 2}, publishOrder(t, b, "k"))
	})

	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailedEventHoldsItsAggregateThroughItsBackoff/partitioned=%t", partitioned), func(t *testing.T) {
			t.Parallel()
			b := newBundleOn(t, kafkatest.NewFake(t), 1, &pgtest.Opts{PartitionEventsByDay: partitioned})
			flakyTopic := b.broker.Topic(t, 1)
			fault := b.broker.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: flakyTopic, Err: kerr.MessageTooLarge, Count: 1})
			first := b.event("k")
			first.Topic = flakyTopic
			b.write(t, first, b.event("k"))
			// The backoff outlasts many claims; each of them must leave seq
			// 2 alone while seq 1 waits to be tried again.
			b.startRelay(t, &producer.RelayConfig{MinBackoff: time.Second, MaxBackoff: time.Second, PollInterval: 10 * time.Millisecond})
			b.waitDelivered(t, 30*time.Second)
			require.Equal(t, 1, fault.Hits())
			require.Equal(t, []int64{1, 2}, publishOrder(t, b, "k"))
		})
	}

	t.Run("WriterThatBeganLateDoesNotLetALaterSeqOut", func(t *testing.T) {
		t.Parallel()
		// next_attempt_at defaults to the writing transaction's start. A
		// writer that began first can commit last and so take the last
		// sequence, with the earliest next_attempt_at; the writers of the
		// earlier sequences began later, possibly after a claim's own
		// transaction began (its now()) and still committed before its
		// snapshot. Seq 1 and 2 below stand for those: due, by their
		// writers' clocks, after the claim's now(). The claim must not
		// take seq 3 alone.
		b := newBundle(t, 1)
		written := b.write(t, b.event("k"), b.event("k"), b.event("k"))
		_, err := b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("events")+` SET next_attempt_at = now() + interval '1 hour' WHERE id = ANY($1)`,
			[]int64{written[0].ID, written[1].ID})
		require.NoError(t, err)
		_, err = b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("events")+` SET next_attempt_at = now() - interval '1 second' WHERE id = $1`, written[2].ID)
		require.NoError(t, err)
		b.startRelay(t, &producer.RelayConfig{PollInterval: 10 * time.Millisecond})
		waitFor(t, 30*time.Second, "a record of k published", func() bool { return len(publishOrder(t, b, "k")) > 0 })
		require.EqualValues(t, 1, publishOrder(t, b, "k")[0], "a later sequence went out first")
		b.waitDelivered(t, 30*time.Second)
		require.Equal(t, []int64{1, 2, 3}, publishOrder(t, b, "k"))
		require.Len(t, checkOrder(t, b.broker.Records(t, b.topic, 3, 30*time.Second)), 3)
	})

	t.Run("LockedEarlierRowHoldsBackItsAggregate", func(t *testing.T) {
		t.Parallel()
		// Another session holds the row lock on seq 1 of k, as a zombie
		// relay still inside its settle transaction does after its lease
		// lapsed: the claim skips the locked row, and must not claim seq 2
		// behind it, while other aggregates flow.
		b := newBundle(t, 1)
		written := b.write(t, b.event("k"), b.event("k"), b.event("other"))
		lock, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer lock.Rollback(ctx)
		_, err = lock.Exec(ctx, `SELECT 1 FROM `+b.db.Table("events")+` WHERE id = $1 FOR UPDATE`, written[0].ID)
		require.NoError(t, err)

		b.startRelay(t, &producer.RelayConfig{PollInterval: 10 * time.Millisecond})
		// other's row and k's seq 2 are candidates of the same claims; had
		// one of them claimed seq 2, it would be marked with other's row.
		delivered := func(id int64) bool {
			var done bool
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM `+b.db.Table("events")+` WHERE id = $1`, id).Scan(&done))
			return done
		}
		claimed := func(id int64) bool {
			var done bool
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT published_at IS NOT NULL OR leased_until IS NOT NULL FROM `+b.db.Table("events")+` WHERE id = $1`, id).Scan(&done))
			return done
		}
		waitFor(t, 30*time.Second, "the other aggregate delivered", func() bool { return delivered(written[2].ID) })
		require.False(t, claimed(written[1].ID), "seq 2 was claimed while seq 1 was locked")
		// A later write of the held aggregate waits too; one of another
		// aggregate does not.
		later := b.write(t, b.event("k"), b.event("third"))
		waitFor(t, 30*time.Second, "the third aggregate delivered", func() bool { return delivered(later[1].ID) })
		require.False(t, claimed(written[1].ID), "seq 2 was claimed while seq 1 was locked")
		require.False(t, claimed(later[0].ID), "seq 3 was claimed while seq 1 was locked")

		require.NoError(t, lock.Rollback(ctx))
		b.waitDelivered(t, 30*time.Second)
		require.Equal(t, []int64{1, 2, 3}, publishOrder(t, b, "k"))
		require.Len(t, checkOrder(t, b.broker.Records(t, b.topic, 5, 30*time.Second)), 5)
	})

	t.Run("LeaseOfAPreviousOwnerHoldsOnlyItsAggregates", func(t *testing.T) {
		t.Parallel()
		// Seq 1 of k is leased for ten more seconds, as a relay that died
		// mid-batch leaves it. The relay that takes the bucket holds k
		// until the lease ends, and publishes the bucket's other aggregate
		// at once. The checks below need the neighbour out before the
		// lease ends: a relay's start, claim and publish under -race on a
		// loaded machine can take more than two seconds, so the lease is long.
		b := newBundle(t, 1)
		var neighbour string
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT 'n-' || g FROM generate_series(1, 10000) g
WHERE hashtext('account:n-' || g) % 64 = hashtext('account:k') % 64 LIMIT 1`).Scan(&neighbour))
		written := b.write(t, b.event("k"), b.event("k"), b.event(neighbour))
		var leasedUntil time.Time
		require.NoError(t, b.db.Pool.QueryRow(ctx, `UPDATE `+b.db.Table("events")+` SET leased_until = now() + interval '10 seconds'
WHERE id = $1 RETURNING leased_until`, written[0].ID).Scan(&leasedUntil))

		relay := b.startRelayWith(t, &producer.RelayConfig{PollInterval: 10 * time.Millisecond})
		waitFor(t, 30*time.Second, "the neighbour delivered", func() bool {
			var done bool
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM `+b.db.Table("events")+` WHERE id = $1`, written[2].ID).Scan(&done))
			return done
		})
		require.True(t, time.Now().Before(leasedUntil), "the neighbour waited for the lease")
		require.Equal(t, 2, b.undelivered(t), "k waits for its lease")
		h := relay.Health()
		require.Equal(t, 64, h.Buckets)
		require.Len(t, h.Held, 1, "%+v", h)
		require.Equal(t, "k", h.Held[0].AggregateID)
		require.False(t, h.Held[0].OwnBatch)
		require.WithinDuration(t, leasedUntil, h.Held[0].Until, time.Second)

		b.waitDelivered(t, 30*time.Second)
		require.Equal(t, []int64{1, 2}, publishOrder(t, b, "k"))
		waitFor(t, 10*time.Second, "the hold gone from health", func() bool { return len(relay.Health().Held) == 0 })
	})

	t.Run("LeasedEarlierRowHoldsBackItsAggregateInTheClaim", func(t *testing.T) {
		t.Parallel()
		// The claim on its own, with no hold: a lease the relay does not
		// know of (renewed by a relay that lost the bucket, after the new
		// owner looked) must still keep seq 2 back.
		b := newBundle(t, 1)
		written := b.write(t, b.event("k"), b.event("k"), b.event("other"))
		_, err := b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("events")+` SET leased_until = now() + interval '1 hour' WHERE id = $1`, written[0].ID)
		require.NoError(t, err)
		buckets := make([]int32, 64)
		for i := range buckets {
			buckets[i] = int32(i)
		}
		rows, err := b.db.Pool.Query(ctx, producer.ClaimSQL(b.db.Schema), buckets, 10, 30_000, []int32{})
		require.NoError(t, err)
		var claimed []int64
		for rows.Next() {
			v, err := rows.Values()
			require.NoError(t, err)
			claimed = append(claimed, v[0].(int64))
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []int64{written[2].ID}, claimed, "only the other aggregate is claimed")
	})

	t.Run("RelayWhoseSessionEndedIsNotCountedLive", func(t *testing.T) {
		t.Parallel()
		// Two rows with fresh heartbeats: one whose lock session still
		// exists, one whose session is gone, as a relay killed a moment ago
		// leaves. The first counts, the second does not: the new relay
		// takes half the buckets, not a third.
		b := newBundle(t, 1)
		alive, err := b.db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer alive.Release()
		_, err = b.db.Pool.Exec(ctx, `INSERT INTO `+b.db.Table("relays")+` (relay_id, heartbeat_at, session_pid)
VALUES ('alive', now() + interval '1 hour', $1), ('dead', now() + interval '1 hour', 2147483647)`, alive.Conn().PgConn().PID())
		require.NoError(t, err)
		relay := b.startRelayWith(t, &producer.RelayConfig{RebalanceInterval: 50 * time.Millisecond})
		waitFor(t, 30*time.Second, "the relay to take its buckets", func() bool { return relay.Health().Buckets > 0 })
		require.Equal(t, 32, relay.Health().Buckets)
	})

	t.Run("PublishesSequencesPastInt32", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 2)
		seqs := []int64{1 << 31, 1 << 53, math.MaxInt64}
		for _, s := range seqs {
			_, err := b.db.Pool.Exec(ctx, `INSERT INTO `+b.db.Table("sequences")+` (aggregate_type, aggregate_id, last_seq) VALUES ('account', $1, $2)`, strconv.FormatInt(s, 10), s-2)
			require.NoError(t, err)
		}
		var events []producer.Event
		for _, s := range seqs {
			events = append(events, b.event(strconv.FormatInt(s, 10)), b.event(strconv.FormatInt(s, 10)))
		}
		b.write(t, events...)
		b.startRelay(t, nil)
		b.waitDelivered(t, 30*time.Second)
		got := map[string][]string{}
		for _, r := range b.broker.Records(t, b.topic, 6, 30*time.Second) {
			seq, _ := header(r, outbox.HeaderAggregateSeq)
			got[string(r.Key)] = append(got[string(r.Key)], seq)
		}
		for _, s := range seqs {
			agg := strconv.FormatInt(s, 10)
			require.Equal(t, []string{strconv.FormatInt(s-1, 10), agg}, got[agg], "aggregate %s", agg)
		}
	})

	t.Run("RebalanceIntervalPastInt32Milliseconds", func(t *testing.T) {
		t.Parallel()
		// Three intervals of ten days are 2,592,000,000 ms, past an int4:
		// the heartbeat's parameter must be a bigint.
		b := newBundle(t, 1)
		b.write(t, b.event("a"))
		b.startRelay(t, &producer.RelayConfig{RebalanceInterval: 240 * time.Hour})
		b.waitDelivered(t, 30*time.Second)
	})

	t.Run("StaleRetryingEntryHoldsNothingBack", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 1)
		first := b.write(t, b.event("k"))
		b.startRelay(t, &producer.RelayConfig{PollInterval: 20 * time.Millisecond})
		b.waitDelivered(t, 30*time.Second)
		// An entry left behind for an event that is delivered by now (an
		// operator's hand, or a trigger dropped and restored) names the
		// aggregate's lowest id; its later events must still go out.
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO `+b.db.Table("retrying_events")+` (id, created_at)
			SELECT id, created_at FROM `+b.db.Table("events")+` WHERE id = $1 UNION ALL SELECT -1, now()`, first[0].ID)
		require.NoError(t, err)
		b.write(t, b.event("k"))
		b.waitDelivered(t, 30*time.Second)
		require.Len(t, b.broker.Records(t, b.topic, 2, 30*time.Second), 2)
	})

	t.Run("SkipDeadReleasesTheAggregate", func(t *testing.T) {
		t.Parallel()
		b := newFaultBundle(t, 1)
		poisonTopic := b.broker.Topic(t, 1)
		b.broker.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: poisonTopic, Err: kerr.TopicAuthorizationFailed, Count: -1})
		b.startRelay(t, &producer.RelayConfig{MaxAttempts: 2, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, PollInterval: 20 * time.Millisecond, OnDead: producer.SkipDead})
		poison := b.event("sick")
		poison.Topic = poisonTopic
		b.write(t, poison, b.event("sick"))
		b.waitDelivered(t, 30*time.Second)
		records := b.broker.Records(t, b.topic, 1, 30*time.Second)
		require.Len(t, records, 1)
		seq, _ := header(records[0], outbox.HeaderAggregateSeq)
		require.Equal(t, "2", seq, "the later event went out, leaving a gap")
		dead := deadEvents(t, b.db)
		list, err := inspector(t, b.db).DeadEvents(ctx, nil)
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.False(t, list[0].Hold)
		require.NoError(t, dead.Discard(ctx, b.db.Pool, list[0].ID))
		h, err := inspector(t, b.db).Health(ctx)
		require.NoError(t, err)
		require.Zero(t, h.Dead)
	})

	t.Run("InstancesComeAndGoWithoutBreakingOrder", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t, 6)
		cfg := &producer.RelayConfig{BatchSize: 100, RebalanceInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond}
		writing, stopWriting := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var written atomic.Int64
		for w := range 4 {
			wg.Go(func() {
				for i := 0; writing.Err() == nil; i++ {
					b.write(t, b.event(aggName((w*7+i)%60)), b.event(aggName((w*13+i)%60)))
					written.Add(2)
				}
			})
		}
		progressed := func(n int64) {
			target := written.Load() + n
			waitFor(t, 60*time.Second, "writes to go on", func() bool { return written.Load() >= target })
		}
		stop1 := b.startRelay(t, cfg)
		progressed(300)
		b.startRelay(t, cfg)
		progressed(300)
		b.startRelay(t, cfg)
		progressed(300)
		stop1()
		progressed(300)
		stopWriting()
		wg.Wait()
		b.waitDelivered(t, 60*time.Second)
		records := b.broker.Records(t, b.topic, int(written.Load()), 60*time.Second)
		require.Len(t, checkOrder(t, records), int(written.Load()))
	})
}

// publishOrder returns the aggregate's sequence numbers in the order they
// were marked delivered, which follows the order of acknowledgements.
func publishOrder(t *testing.T, b *bundle, aggregateID string) []int64 {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT aggregate_seq FROM `+b.db.Table("events")+
		` WHERE aggregate_id = $1 AND published_at IS NOT NULL ORDER BY published_at, aggregate_seq`, aggregateID)
	require.NoError(t, err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return seqs
}

// errConnDropped, returned from a kfake control function, makes the fake
// broker close the client's connection.
var errConnDropped = errors.New("connection dropped on purpose")

func kafkaFault(keys []kmsg.Key, err *kerr.Error, count int) kfake.Fault {
	return kfake.Fault{Keys: keys, Err: err, Count: count}
}

func TestNewRelayRefusesBadConfig(t *testing.T) {
	t.Parallel()
	db := newBundle(t, 1)
	client := db.broker.Client(t)
	for _, tc := range []struct {
		name string
		cfg  producer.RelayConfig
		msg  string
	}{
		{"LeaseNotAbovePublishTimeout", producer.RelayConfig{Lease: time.Second, PublishTimeout: time.Second}, "Lease (1s) must exceed PublishTimeout (1s)"},
		{"BackoffBoundsSwapped", producer.RelayConfig{MinBackoff: time.Minute, MaxBackoff: time.Second}, "MinBackoff (1m0s) exceeds MaxBackoff (1s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := producer.NewRelay(db.db.Pool, client, &tc.cfg)
			require.ErrorContains(t, err, tc.msg)
		})
	}
	_, err := producer.NewRelay(db.db.Pool, db.broker.Client(t, kgo.DisableIdempotentWrite()), nil)
	require.ErrorContains(t, err, "kgo.DisableIdempotentWrite()")
	_, err = producer.NewRelay(nil, client, nil)
	require.ErrorContains(t, err, "needs a pool")
}
