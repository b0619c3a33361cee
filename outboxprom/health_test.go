package outboxprom_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/outboxprom"
	"github.com/d419a114/outbox/producer"
)

func TestHealthCollector(t *testing.T) {
	t.Parallel()
	// collector registers a HealthCollector of db on a registry that
	// checks its metrics against its descriptors.
	collector := func(t *testing.T, db consumer.DB, cfg outboxprom.HealthConfig) *prometheus.Registry {
		t.Helper()
		cfg.Logger = quiet
		h, err := outboxprom.NewHealthCollector(db, &cfg)
		require.NoError(t, err)
		reg := prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(h))
		return reg
	}

	// Events written while no relay runs show up as undelivered after the
	// next sample, with an age; a relay delivers them and both fall to 0.
	t.Run("BacklogRisesAndDrains", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		broker := kafkatest.New(t)
		topic := broker.Topic(t, 1)
		reg := collector(t, db.Pool, outboxprom.HealthConfig{Schema: db.Schema, Interval: 20 * time.Millisecond})
		require.Zero(t, value(t, reg, outboxprom.EventsUndelivered))
		require.Equal(t, 1.0, value(t, reg, outboxprom.HealthUp, "source", "producer"))
		require.Zero(t, value(t, reg, outboxprom.RelaysLive), "no relay runs yet")

		write(t, db, events(topic, 5)...)
		eventually.True(t, 10*time.Second, func() bool {
			return value(t, reg, outboxprom.EventsUndelivered) == 5 && value(t, reg, outboxprom.EventsUndeliveredOldestAge) > 0
		}, "the backlog sampled")

		startRelay(t, db, broker, producer.RelayConfig{PollInterval: 20 * time.Millisecond})
		eventually.True(t, 30*time.Second, func() bool {
			return value(t, reg, outboxprom.EventsUndelivered) == 0 && value(t, reg, outboxprom.EventsUndeliveredOldestAge) == 0
		}, "the backlog drained")
		require.Zero(t, value(t, reg, outboxprom.EventsDead))
		require.Equal(t, 1.0, value(t, reg, outboxprom.RelaysLive), "the relay that drained it")
	})

	// A schema in CDC mode reports its slot: inactive (and gone) here,
	// with the slot never created; a relay-mode schema reports nothing of
	// it.
	t.Run("CDCSlot", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		reg := collector(t, db.Pool, outboxprom.HealthConfig{Schema: db.Schema, Interval: 20 * time.Millisecond})
		require.Zero(t, len(series(t, reg, outboxprom.CDCSlotActive)), "relay mode reports no slot")
		_, err := db.Pool.Exec(context.Background(), `UPDATE `+db.Table("dispatch")+` SET mode = 'cdc', slot_name = 'no_such_slot'`)
		require.NoError(t, err)
		eventually.True(t, 10*time.Second, func() bool { return len(series(t, reg, outboxprom.CDCSlotActive)) == 1 }, "the slot sampled")
		require.Zero(t, value(t, reg, outboxprom.CDCSlotActive))
		require.Zero(t, value(t, reg, outboxprom.CDCRetainedWAL))
	})

	// A consumer's dead letter, the record parked behind it and its
	// processed keys are reported under its name.
	t.Run("ConsumerHealth", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		p, err := consumer.Handle(db.Pool, "svc", failingHandler, &consumer.Config{Schema: db.Schema,
			MaxAttempts: 2, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, Logger: quiet})
		require.NoError(t, err)
		for _, r := range []*kgo.Record{
			rec("orders", "a", 1, "a1", time.Time{}), rec("orders", "a", 2, "a2", time.Time{}),
			rec("orders", "p", 1, "p1", time.Time{}), rec("orders", "p", 2, "p2", time.Time{}),
		} {
			_, err := p.Process(context.Background(), r)
			require.NoError(t, err)
		}
		reg := collector(t, db.Pool, outboxprom.HealthConfig{Schema: db.Schema, SkipProducer: true, Consumers: []string{"svc", "idle"}})

		require.Equal(t, 1.0, value(t, reg, outboxprom.ConsumerDeadLetters, "consumer", "svc", "topic", "orders", "reason", "handler"))
		require.Positive(t, value(t, reg, outboxprom.ConsumerDeadLetterOldestAge, "consumer", "svc", "topic", "orders", "reason", "handler"))
		require.Equal(t, 1.0, value(t, reg, outboxprom.ConsumerParkedAggregates, "consumer", "svc"))
		require.Equal(t, 1.0, value(t, reg, outboxprom.ConsumerParkedRecords, "consumer", "svc"))
		require.Positive(t, value(t, reg, outboxprom.ConsumerParkedOldestAge, "consumer", "svc"))
		require.Equal(t, 3.0, value(t, reg, outboxprom.ConsumerProcessedKeys, "consumer", "svc"), "a1, a2 and the parked p2")
		require.Positive(t, value(t, reg, outboxprom.ConsumerProcessedKeyOldestAge, "consumer", "svc"))
		require.Zero(t, value(t, reg, outboxprom.ConsumerMembersLive, "consumer", "svc"), "a Processor of one's own loop is no member")

		require.Empty(t, series(t, reg, outboxprom.ConsumerDeadLetters, "consumer", "idle"))
		require.Zero(t, value(t, reg, outboxprom.ConsumerParkedRecords, "consumer", "idle"))
		require.Zero(t, value(t, reg, outboxprom.ConsumerProcessedKeys, "consumer", "idle"))
		require.Empty(t, series(t, reg, outboxprom.EventsUndelivered), "SkipProducer")
		require.Len(t, series(t, reg, outboxprom.HealthUp, "source", "consumer"), 2, "one per consumer")
	})

	// The topics' retention and the consumers' key retention are reported
	// side by side: a topic that keeps records longer than the keys are
	// kept (here forever) is what the dedupe-horizon alert looks for.
	t.Run("Retention", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		broker := kafkatest.New(t)
		week, forever := broker.Topic(t, 1), broker.Topic(t, 1)
		adm := kadm.NewClient(broker.Client(t))
		v := "-1"
		_, err := adm.AlterTopicConfigs(context.Background(), []kadm.AlterConfig{{Name: "retention.ms", Value: &v}}, forever)
		require.NoError(t, err)
		reg := collector(t, db.Pool, outboxprom.HealthConfig{Schema: db.Schema, SkipProducer: true, Consumers: []string{"svc"},
			Topics: []string{week, forever}, TopicConfigs: adm, KeyRetention: 24 * time.Hour})
		require.Equal(t, 86400.0, value(t, reg, outboxprom.ConsumerKeyRetention, "consumer", "svc"))
		require.Equal(t, 604800.0, value(t, reg, outboxprom.TopicRetention, "topic", week), "the broker's default, 7 days")
		require.Equal(t, -1.0, value(t, reg, outboxprom.TopicRetention, "topic", forever))
		require.Equal(t, 1.0, value(t, reg, outboxprom.HealthUp, "source", "topic_retention"))
	})

	// However many scrapes come at once, and however often, the database
	// is read once per Interval.
	t.Run("ReadsOncePerInterval", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		counted := &countingDB{Pool: db.Pool}
		reg := collector(t, counted, outboxprom.HealthConfig{Schema: db.Schema, Consumers: []string{"svc"}, Interval: time.Hour})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 5 {
					if _, err := reg.Gather(); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		one := counted.reads.Load()
		require.Positive(t, one)

		fresh := &countingDB{Pool: db.Pool}
		single := collector(t, fresh, outboxprom.HealthConfig{Schema: db.Schema, Consumers: []string{"svc"}, Interval: time.Hour})
		_, err := single.Gather()
		require.NoError(t, err)
		require.Equal(t, fresh.reads.Load(), one, "40 scrapes read what one does")
	})

	// A read stuck behind a lock fails at Timeout: the scrape returns with
	// outbox_health_up 0 and without the producer's numbers, while the
	// consumer, read at the same time, is reported; once the lock is gone
	// the next sample has the producer's numbers again. The consumer's
	// reads must finish within Timeout, on connections the pool dials
	// first: a second, not 100 ms, which a loaded machine can miss.
	t.Run("ScrapeWaitsAtMostTimeout", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		ctx := context.Background()
		lock, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer lock.Rollback(ctx)
		_, err = lock.Exec(ctx, `LOCK TABLE `+db.Table("events")+` IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		reg := collector(t, db.Pool, outboxprom.HealthConfig{Schema: db.Schema, Consumers: []string{"svc"},
			Interval: 500 * time.Millisecond, Timeout: time.Second})

		start := time.Now()
		require.Zero(t, value(t, reg, outboxprom.HealthUp, "source", "producer"))
		require.Less(t, time.Since(start), 20*time.Second, "the scrape returned at the timeout, not when the lock went")
		require.Empty(t, series(t, reg, outboxprom.EventsUndelivered))
		require.Equal(t, 1.0, value(t, reg, outboxprom.HealthUp, "source", "consumer", "name", "svc"))
		require.Zero(t, value(t, reg, outboxprom.ConsumerParkedRecords, "consumer", "svc"))

		require.NoError(t, lock.Rollback(ctx))
		eventually.True(t, 10*time.Second, func() bool {
			return value(t, reg, outboxprom.HealthUp, "source", "producer") == 1 && len(series(t, reg, outboxprom.EventsUndelivered)) == 1
		}, "the producer sampled again")
	})

	// A group's lag is reported per partition from its commits, and falls
	// as it commits further.
	t.Run("GroupLag", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		broker := kafkatest.New(t)
		topic := broker.Topic(t, 2)
		group := topic + "-group"
		ctx := context.Background()
		pub := broker.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
		for _, part := range []int32{0, 0, 0, 1} {
			require.NoError(t, pub.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: part, Value: []byte("v")}).FirstErr())
		}
		adm := kadm.NewClient(broker.Client(t))
		commit := func(p0, p1 int64) {
			t.Helper()
			offsets := kadm.Offsets{}
			offsets.AddOffset(topic, 0, p0, -1)
			offsets.AddOffset(topic, 1, p1, -1)
			resp, err := adm.CommitOffsets(ctx, group, offsets)
			require.NoError(t, err)
			require.NoError(t, resp.Error())
		}
		commit(1, 1)
		reg := collector(t, db.Pool, outboxprom.HealthConfig{Schema: db.Schema, SkipProducer: true,
			Lag: adm, Groups: []string{group}, Interval: 20 * time.Millisecond})
		require.Equal(t, 2.0, value(t, reg, outboxprom.ConsumerGroupLag, "group", group, "topic", topic, "partition", "0"))
		require.Equal(t, 0.0, value(t, reg, outboxprom.ConsumerGroupLag, "group", group, "topic", topic, "partition", "1"))
		require.Equal(t, 1.0, value(t, reg, outboxprom.HealthUp, "source", "group_lag", "name", group))

		commit(3, 1)
		eventually.True(t, 10*time.Second, func() bool {
			return value(t, reg, outboxprom.ConsumerGroupLag, "group", group, "topic", topic, "partition", "0") == 0
		}, "the lag gone with the commit")
	})
}

// countingDB is a pool that counts the queries sent through it.
type countingDB struct {
	*pgxpool.Pool
	reads atomic.Int64
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.reads.Add(1)
	return c.Pool.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.reads.Add(1)
	return c.Pool.QueryRow(ctx, sql, args...)
}

// NewHealthCollector refuses a configuration it cannot sample, saying why.
func TestNewHealthCollector(t *testing.T) {
	t.Parallel()
	db := &pgxpool.Pool{}
	adm := kadm.NewClient(nil)
	for _, tc := range []struct {
		name string
		db   consumer.DB
		cfg  *outboxprom.HealthConfig
		want string
	}{
		{"NoDatabase", nil, nil, "needs a database"},
		{"NegativeInterval", db, &outboxprom.HealthConfig{Interval: -time.Second}, "must not be negative"},
		{"NegativeTimeout", db, &outboxprom.HealthConfig{Timeout: -time.Second}, "must not be negative"},
		{"LagWithoutGroups", db, &outboxprom.HealthConfig{Lag: adm}, "Lag and Groups go together"},
		{"GroupsWithoutLag", db, &outboxprom.HealthConfig{Groups: []string{"g"}}, "Lag and Groups go together"},
		{"EmptyConsumer", db, &outboxprom.HealthConfig{Consumers: []string{""}}, "HealthConfig.Consumers"},
		{"RepeatedConsumer", db, &outboxprom.HealthConfig{Consumers: []string{"a", "a"}}, "HealthConfig.Consumers"},
		{"RepeatedGroup", db, &outboxprom.HealthConfig{Lag: adm, Groups: []string{"g", "g"}}, "HealthConfig.Groups"},
		{"NothingToSample", db, &outboxprom.HealthConfig{SkipProducer: true}, "nothing to sample"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := outboxprom.NewHealthCollector(tc.db, tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := outboxprom.NewHealthCollector(db, nil)
	require.NoError(t, err, "nil means defaults")
}
