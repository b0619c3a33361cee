package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
)

// TestStartUp: a Consumer refuses what would make it wait or retry for
// ever without a word (a database never migrated, a schema older than the
// SDK, a pool too small), and says at INFO that it runs and which
// partitions it was given.
func TestStartUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("UnmigratedSchemaIsRefused", func(t *testing.T) {
		t.Parallel()
		b := newGroupBundle(t, 1)
		cfg := fastConfig(b.db, 1)
		cfg.Schema = "never_migrated"
		c, err := consumer.New(b.db.Pool, b.client(t, b.group), "svc", b.effects, cfg)
		require.NoError(t, err)
		err = c.Run(ctx)
		require.ErrorContains(t, err, `schema "never_migrated" has no outbox tables in this database`)
		require.ErrorContains(t, err, "outbox.Migrate")
	})

	t.Run("OlderSchemaIsRefused", func(t *testing.T) {
		t.Parallel()
		b := newGroupBundle(t, 1)
		_, err := b.db.Pool.Exec(ctx, `DELETE FROM `+b.db.Table("schema_versions")+` WHERE version = (SELECT max(version) FROM `+b.db.Table("schema_versions")+`)`)
		require.NoError(t, err)
		c, err := consumer.New(b.db.Pool, b.client(t, b.group), "svc", b.effects, fastConfig(b.db, 1))
		require.NoError(t, err)
		err = c.Run(ctx)
		require.ErrorContains(t, err, "and this SDK needs")
		require.ErrorContains(t, err, "outbox.Migrate")
	})

	// A stop through ctx is not an error, even before Run has started to
	// consume: its schema check then fails on the cancelled context.
	t.Run("StoppedBeforeStartReturnsNil", func(t *testing.T) {
		t.Parallel()
		b := newGroupBundle(t, 1)
		c, err := consumer.New(b.db.Pool, b.client(t, b.group), "svc", b.effects, fastConfig(b.db, 1))
		require.NoError(t, err)
		stopped, cancel := context.WithCancel(ctx)
		cancel()
		require.NoError(t, c.Run(stopped))
	})

	t.Run("PoolTooSmallIsRefused", func(t *testing.T) {
		t.Parallel()
		b := newGroupBundle(t, 1)
		cfg := b.db.Pool.Config()
		cfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer pool.Close()
		_, err = consumer.New(pool, b.client(t, b.group), "svc", b.effects, fastConfig(b.db, 1))
		require.ErrorContains(t, err, "the pool allows 1 connections and a Consumer needs at least 2")
	})

	t.Run("SmallestPoolApplies", func(t *testing.T) {
		t.Parallel()
		b := newGroupBundle(t, 1)
		cfg := b.db.Pool.Config()
		cfg.MaxConns = 2
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer pool.Close()
		b.produce(t, stream(4, 20)...)
		c, err := consumer.New(pool, b.client(t, b.group), "svc", b.effects, fastConfig(b.db, 1))
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		eventually.True(t, 30*time.Second, func() bool { rows, _ := b.effects.count(t); return rows == 20 }, "every record applied")
		cancel()
		require.NoError(t, <-done)
	})

	t.Run("StartAndAssignmentAreLogged", func(t *testing.T) {
		t.Parallel()
		b := newGroupBundle(t, 2)
		var logs lockedBuffer
		cfg := fastConfig(b.db, 1)
		cfg.Logger = logs.logger()
		b.start(t, b.effects, cfg)
		eventually.True(t, 30*time.Second, func() bool {
			s := logs.String()
			return containsAll(s, `msg="consumer: started"`, "group="+b.group, `msg="consumer: partitions assigned"`, "member_id=", "map["+b.topic+":[")
		}, "start and assignment logged at INFO with group, member and partitions", &logs)
		require.NotContains(t, logs.String(), "classic group protocol", "the default balancer runs the consumer group protocol")
	})

	// A balancer that makes franz-go fall back to the classic protocol, in
	// which one dead member stops the whole group, is said at start.
	t.Run("ClassicProtocolIsWarnedOf", func(t *testing.T) {
		t.Parallel()
		b := newGroupBundle(t, 1)
		var logs lockedBuffer
		cfg := fastConfig(b.db, 1)
		cfg.Logger = logs.logger()
		cl := b.broker.Client(t, append(append([]kgo.Opt{
			kgo.ConsumerGroup(b.group), kgo.ConsumeTopics(b.topic),
		}, consumer.ClientOpts()...), kgo.Balancers(kgo.RoundRobinBalancer()))...)
		c, err := consumer.New(b.db.Pool, cl, "svc", b.effects, cfg)
		require.NoError(t, err)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		eventually.True(t, 30*time.Second, func() bool {
			return strings.Contains(logs.String(), "first balancer is roundrobin, so franz-go uses the classic group protocol")
		}, "a WARN naming the balancer", &logs)
		cancel()
		require.NoError(t, <-done)
	})
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestMembers: a running Consumer beats in its database, with its
// partitions and the records it applied, counts them per minute, and
// removes its row when it stops.
func TestMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newGroupBundle(t, 2)
	b.produce(t, stream(4, 20)...)
	r := b.start(t, b.effects, fastConfig(b.db, 1))
	var live []consumer.Member
	eventually.True(t, 30*time.Second, func() bool {
		ms, err := mustInspector(t, b.db.Pool, b.db.Schema).Members(ctx, "svc")
		require.NoError(t, err)
		live = ms
		return len(ms) == 1 && ms[0].Applied == 20 && ms[0].Partitions == 2
	}, "one live member that applied 20 records on 2 partitions")
	require.True(t, live[0].Live)
	require.Equal(t, b.group, live[0].Group)
	var applied int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM `+b.db.Table("activity")+` WHERE kind = 'applied' AND name = 'svc'`).Scan(&applied))
	require.EqualValues(t, 20, applied, "the minute's activity counts them")
	r.stop(t)
	ms, err := mustInspector(t, b.db.Pool, b.db.Schema).Members(ctx, "svc")
	require.NoError(t, err)
	require.Empty(t, ms, "a clean stop removes the row")
}
