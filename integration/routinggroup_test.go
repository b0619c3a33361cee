package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/integration/history"
)

// routingGroup is the consumer group: members of consumer.New with a
// Route over the two targets, each member with a pool per target.
type routingGroup struct {
	w       *shardWorld
	started int
	members []*routingMember

	outcomes
}

// routingMember is one running member.
type routingMember struct {
	name   string
	app    string
	cancel context.CancelFunc
	done   chan error
	client *kgo.Client
	pools  []*pgxpool.Pool
	once   sync.Once
}

// Handle is the application: one effect row per event in the effects
// table of the target that owns its aggregate, in the handler's
// transaction, which is that target's.
func (g *routingGroup) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+g.w.targetOf(m.AggregateID).db.Table("effects")+` (event_id, aggregate_type, aggregate_id, seq) VALUES ($1, $2, $3, $4)`,
		m.IdempotencyKey, m.AggregateType, m.AggregateID, m.Seq)
	return err
}

func (g *routingGroup) groupName() string { return "group-" + g.w.topic }

// start runs a new member until it is killed or the test ends.
func (g *routingGroup) start(concurrency int) *routingMember {
	w := g.w
	w.t.Helper()
	g.started++
	m := &routingMember{name: fmt.Sprintf("m%d", g.started), done: make(chan error, 1)}
	m.app = "scn_member_" + m.name
	route := &consumer.Route{Owner: w.owner}
	for _, tg := range w.targets {
		cfg, err := pgxpool.ParseConfig(tg.db.Server.URL)
		require.NoError(w.t, err)
		cfg.MaxConns = 8
		cfg.ConnConfig.RuntimeParams["application_name"] = m.app
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(w.t, err)
		m.pools = append(m.pools, pool)
		route.Targets = append(route.Targets, consumer.Target{Name: tg.name, DB: pool, Schema: tg.db.Schema})
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(w.broker.Addrs...),
		kgo.ConsumerGroup(g.groupName()),
		kgo.ConsumeTopics(w.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.MetadataMinAge(100 * time.Millisecond),
	}, consumer.ClientOpts()...)...)
	require.NoError(w.t, err)
	m.client = cl
	c, err := consumer.New(nil, cl, "ledger", g, &consumer.Config{
		Route:          route,
		Concurrency:    concurrency,
		MinBackoff:     5 * time.Millisecond,
		MaxBackoff:     100 * time.Millisecond,
		MaxPollRecords: 200,
		ShutdownGrace:  5 * time.Second,
		Tracer:         g,
		Logger:         testLogger(w.t, m.name),
	})
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() { m.done <- c.Run(ctx) }()
	g.members = append(g.members, m)
	w.t.Cleanup(func() { g.stop(m) })
	return m
}

// kill ends member i as its process' death would end its work: its
// sessions on both targets are terminated (transactions in flight roll
// back), then it is cancelled. On kfake the broker also refuses the
// group's offset commits from before the terminate until the member
// stopped, so that the effects it committed are never acknowledged and
// come back to the next owner of its partitions as redeliveries.
func (g *routingGroup) kill(i int) (*routingMember, int) {
	m := g.members[i]
	g.members = slices.Delete(g.members, i, i+1)
	if fake := g.w.broker.Fake; fake != nil {
		h := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: g.groupName(), Err: kerr.RebalanceInProgress, Count: -1})
		defer h.Remove()
	}
	n := 0
	for _, tg := range g.w.targets {
		n += terminateApp(g.w.t, tg.db, m.app)
	}
	g.stop(m)
	return m, n
}

// stop cancels the member, waits for Run and closes its client and pools.
func (g *routingGroup) stop(m *routingMember) {
	m.once.Do(func() {
		m.cancel()
		select {
		case err := <-m.done:
			if err != nil && !errors.Is(err, consumer.ErrClosed) {
				g.w.t.Errorf("member %s: Run: %v", m.name, err)
			}
		case <-time.After(60 * time.Second):
			g.w.t.Fatalf("member %s did not return within 60s of cancellation", m.name)
		}
		m.client.Close()
		for _, p := range m.pools {
			p.Close()
		}
	})
}

// applied counts the effects committed in both targets.
func (g *routingGroup) applied() int {
	total := 0
	for _, tg := range g.w.targets {
		var n int
		if err := tg.db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT event_id) FROM `+tg.db.Table("effects")).Scan(&n); err != nil {
			return -1
		}
		total += n
	}
	return total
}

// waitApplied waits until the effects reach want, or cover every event
// committed so far when that is fewer.
func (g *routingGroup) waitApplied(want int, within time.Duration, what string) {
	g.w.t.Helper()
	waitUntil(g.w.t, within, what, func() bool {
		g.w.mu.Lock()
		committed := len(g.w.committed)
		g.w.mu.Unlock()
		n := g.applied()
		return n >= want || n >= committed
	})
}

// drain waits until every committed event's effect is applied, every
// shard's outbox rows are all marked delivered (none held either), and the
// group's offsets reach the end of every partition; then it stops the
// members and records the effects of both targets in the history.
func (g *routingGroup) drain(within time.Duration) {
	w := g.w
	w.t.Helper()
	start := time.Now()
	w.resolve()
	w.mu.Lock()
	want := len(w.committed)
	w.mu.Unlock()
	waitUntil(w.t, within, fmt.Sprintf("all %d committed events applied", want), func() bool { return g.applied() >= want })
	ctx := context.Background()
	waitUntil(w.t, within, "every shard's outbox rows marked delivered", func() bool {
		for _, s := range w.shards {
			var n int
			if err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s.db.Table("events")+` WHERE published_at IS NULL`).Scan(&n); err != nil || n > 0 {
				return false
			}
		}
		return true
	})
	adm := kadm.NewClient(w.broker.Client(w.t))
	waitUntil(w.t, within, "the group's offsets at the end of every partition", func() bool {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ends, err := adm.ListEndOffsets(ctx, w.topic)
		if err != nil || ends.Error() != nil {
			return false
		}
		offs, err := adm.FetchOffsets(ctx, g.groupName())
		if err != nil {
			return false
		}
		caughtUp := true
		ends.Each(func(o kadm.ListedOffset) {
			if o.Offset == 0 {
				return
			}
			c, ok := offs.Lookup(w.topic, o.Partition)
			caughtUp = caughtUp && ok && c.At >= o.Offset
		})
		return caughtUp
	})
	for _, m := range g.members {
		g.stop(m)
	}
	g.members = nil
	w.t.Logf("drained in %s", time.Since(start).Round(time.Millisecond))
	for _, tg := range w.targets {
		rows, err := tg.db.Pool.Query(ctx, `SELECT event_id, aggregate_type, aggregate_id, seq FROM `+tg.db.Table("effects")+` ORDER BY n`)
		require.NoError(w.t, err)
		for rows.Next() {
			h := history.Handle{Applied: true, Where: tg.name}
			require.NoError(w.t, rows.Scan(&h.Key, &h.Aggregate.Type, &h.Aggregate.ID, &h.Seq))
			require.Same(w.t, tg, w.targetOf(h.Aggregate.ID), "effect of %s applied in %s, which does not own it", h.Aggregate, tg.name)
			w.rec.Handle(h)
		}
		require.NoError(w.t, rows.Err())
	}
}

// settled fails unless no target holds a parked record or an open dead
// letter.
func (g *routingGroup) settled() {
	w := g.w
	w.t.Helper()
	for _, tg := range w.targets {
		var parked, dead int
		require.NoError(w.t, tg.db.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+tg.db.Table("parked")+`),
			(SELECT count(*) FROM `+tg.db.Table("dead_letters")+` WHERE status = 'dead')`).Scan(&parked, &dead))
		require.Zero(w.t, parked, "records still parked in %s", tg.name)
		require.Zero(w.t, dead, "dead letters still open in %s", tg.name)
	}
	w.t.Logf("consumer outcomes: %d duplicates skipped, %d parked, %d dead-lettered", g.duplicates.Load(), g.parked.Load(), g.dead.Load())
}
