package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
)

// ClientOpts are the options a client needs to be given to New, on top of
// the user's own (seed brokers, kgo.ConsumerGroup, kgo.ConsumeTopics):
// offsets are committed by the Consumer after the database commit, never
// automatically; the group's revocations and losses of partitions go to
// the Consumer running on the client, which finishes or abandons their
// records before the partitions move on (see Consumer); and a rebalance
// waits until the records of the poll before it are in their lanes
// (kgo.BlockRebalanceOnPoll), so that a poll never hands the Consumer
// records of a partition it no longer owns, or stale ones of a partition
// that came back. A hook (kgo.WithHooks) tells the Consumer which
// partitions franz-go still holds fetched records of, so that it pauses a
// full lane's partition without making franz-go fetch them again (see
// Consumer).
//
// The group runs the consumer group protocol (KIP-848,
// kgo.ServerSideBalancer) when the broker offers it: Kafka 4.0 and later
// (4.3 or later recommended) with "consumer" in
// group.coordinator.rebalance.protocols, its default. The broker then
// assigns the partitions, and a member's death or arrival moves only the
// partitions concerned while the other members go on: a member killed
// with SIGKILL stops only its own partitions, until the broker fences it
// after group.consumer.session.timeout.ms (45 s by default; see
// docs/deployment.md for the values to set). It needs franz-go's default
// balancer, or any sticky or range balancer first in kgo.Balancers;
// another balancer, or a broker without the protocol, gives the classic
// protocol, under which a member's death stops every member of the group
// until its kgo.SessionTimeout (45 s by default) has passed.
func ClientOpts() []kgo.Opt {
	return []kgo.Opt{kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.ServerSideBalancer(),
		kgo.OnPartitionsAssigned(onAssigned), kgo.OnPartitionsRevoked(onRevoked), kgo.OnPartitionsLost(onLost),
		kgo.WithHooks(&fetchWatch{})}
}

// Consumer runs a Processor over a franz-go consumer group. Each assigned
// partition has a lane of its own: one poll loop feeds the lanes, and a
// lane that is full ([Config.PartitionBuffer]) pauses the fetching of its
// partition alone, so a slow or stuck partition never delays the records of
// another. A full lane first takes the rest of the fetch franz-go holds of
// its partition (franz-go would otherwise drop it, and fetch and decode it
// again after the resume), so it can hold up to one fetch of its partition
// more than PartitionBuffer.
//
// Inside a lane, up to [Config.Concurrency] records (or batches, with
// BatchSize above 1) are in flight at once, never two of one aggregate
// (records without aggregate headers are grouped by their record key;
// records with neither go freely), and each aggregate's records are applied
// in offset order. At Concurrency 1, the default, a partition's records go
// strictly one after another in offset order.
//
// Each partition's offset is committed up to its lowest record not yet
// done, every [Config.CommitInterval], when the partition is revoked and when
// Run returns; never past a record whose transaction has not committed.
// After a crash, the records above that offset that were done already are
// redelivered and skipped by dedupe, so no map of done offsets is kept
// anywhere. A record that is not done (the database is down, or under
// ordering.GapFail its gap is open) is retried with backoff; it holds back
// its aggregate and pins its partition's committed offset, while the rest
// of the partition goes on until the lane is full.
//
// When the group revokes partitions (a member joins or leaves; on the
// consumer group protocol, and on the classic one with the default
// cooperative-sticky balancer, only those partitions move), their
// lanes stop taking records, the records in flight get [Config.ShutdownGrace]
// to finish, after which their handlers' contexts are cancelled and their
// transactions rolled back, and the lanes' offsets are committed before the
// group goes on: no record is in two members' handlers at once. The poll
// loop blocks the group's rebalances only while it hands a poll's records
// to their lanes, never while handlers run; while a revocation's callback
// waits for its records, the other lanes go on with what they hold but
// receive nothing new. When
// partitions are lost (this member missed its session timeout and another
// may own them already), their records in flight are abandoned at once and
// nothing is committed for them; dedupe keeps effects single.
//
// The client must be created with ClientOpts.
//
// On a share group (a client made with kgo.ShareGroup; Kafka 4.2 and
// later), the broker hands a partition's records to many members in no
// order, so New takes only a handler that needs none ([Config.Unordered]).
// Each poll's records are applied with up to [Config.Concurrency] at once
// (BatchSize records of one partition together) and each is acknowledged
// by its outcome: applied and duplicate records are accepted,
// dead-lettered ones rejected (the dead letter keeps them for Replay). A
// record that is not done is retried until Run stops; then it is released
// for another delivery, or, when this was its last one
// (share.delivery.count.limit), dead-lettered with ErrDeliveryLimit and
// rejected, so that the broker never archives a record the consumer did
// not see through. The next poll waits until every record of the last one
// is acknowledged, because franz-go accepts at a poll whatever the
// previous poll left unacknowledged. When Run stops, the client stops
// fetching: close it soon after. A member that crashes leaves its records
// to the broker's acquisition lock (share.record.lock.duration.ms), after
// which they are delivered again, and dedupe skips those it applied; a
// crash on a record's last delivery leaves it archived by the broker,
// without a dead letter.
type Consumer struct {
	proc   *Processor
	client *kgo.Client
	// db, name, cfg and log are the Processor's, for the runner's own
	// work: heartbeats, and ending the sessions of abandoned transactions.
	db   DB
	name string
	cfg  Config
	log  *slog.Logger
	// share says the client is in a share group (see shareLoop); paused
	// makes its fetching stop once.
	share  bool
	paused sync.Once
	// watch is the hook ClientOpts installs on the client, which tells
	// the poll loop whether franz-go still holds records of a partition;
	// nil when the client has none.
	watch *fetchWatch
	// running guards against two Runs.
	running atomic.Bool

	// mu guards lanes and closing; take it before a lane's mu, never
	// after.
	mu    sync.Mutex
	lanes map[partition]*lane
	// closing is set when Run ends: no lane is made after it.
	closing bool
	// commitMu makes commits one at a time, so that a periodic commit
	// cannot land after the commit of a revocation.
	commitMu sync.Mutex
	// open holds the sessions of the transactions open in the work Run
	// started (lanes, share rounds, the drainer, operator requests), for
	// Run to end when it abandons them; each lane's set is part of it.
	open openSet
}

// partition names a topic's partition.
type partition struct {
	topic string
	num   int32
}

// New returns a Consumer that applies the records of client's group through
// h for the consumer name. See Handle for db and name. New fails if the
// client has no consumer group, has auto-commit enabled, does not block
// rebalances on poll, or does not route its rebalances to the Consumer;
// the error says which option to add. To
// check the last, New calls the client's OnPartitionsRevoked and
// OnPartitionsLost callbacks once each with no partitions.
//
// With [Config.Route] set, db must be nil and the Consumer applies each
// record in the target that owns it (see Route): each target's pool must
// allow the connections a pool of a one-database Consumer would, and the
// drainer, the pruner and the operator requests run for every target. The
// member's heartbeats (the dashboard's members) go to the fallback target.
func New(db DB, client *kgo.Client, name string, h Handler, cfg *Config) (*Consumer, error) {
	routed := cfg != nil && cfg.Route != nil
	if (db == nil && !routed) || h == nil || client == nil {
		return nil, errors.New("consumer: New needs a database (or Config.Route), a client and a handler")
	}
	if routed {
		if db != nil {
			return nil, errors.New("consumer: both a database and Config.Route given; pass a nil database when Config.Route names the target databases")
		}
		for _, t := range cfg.Route.Targets {
			if t.DB == nil {
				continue // Handle says so
			}
			if err := checkPool(t.DB); err != nil {
				return nil, fmt.Errorf("target %q: %w", t.Name, err)
			}
		}
	} else if err := checkPool(db); err != nil {
		return nil, err
	}
	if g, _ := client.OptValue(kgo.ShareGroup).(string); g != "" {
		if cfg == nil || !cfg.Unordered {
			return nil, fmt.Errorf("consumer: client is in share group %q, which hands a partition's records to many members in no order; an ordered handler cannot run on it: set Config.Unordered if the handler needs no order (each record is still applied once), or consume with kgo.ConsumerGroup", g)
		}
		p, err := Handle(db, name, h, cfg)
		if err != nil {
			return nil, err
		}
		return newConsumer(p, client, true), nil
	}
	if g, _ := client.OptValue(kgo.ConsumerGroup).(string); g == "" {
		return nil, errors.New("consumer: client has no consumer group; create it with kgo.ConsumerGroup(name) (or kgo.ShareGroup(name), with Config.Unordered) and kgo.ConsumeTopics(...)")
	}
	if off, _ := client.OptValue(kgo.DisableAutoCommit).(bool); !off {
		return nil, errors.New("consumer: client has auto-commit enabled; create it with kgo.DisableAutoCommit() (see consumer.ClientOpts): offsets must be committed only after the database commit")
	}
	if block, _ := client.OptValue(kgo.BlockRebalanceOnPoll).(bool); !block {
		return nil, errors.New("consumer: client does not block rebalances on poll; create it with kgo.BlockRebalanceOnPoll() (see consumer.ClientOpts): without it a poll can return records of a partition the group has just moved")
	}
	if !routesToConsumer(client) {
		return nil, errors.New("consumer: client's OnPartitionsRevoked and OnPartitionsLost are not the Consumer's; create the client with consumer.ClientOpts() and no callbacks of its own: the Consumer must finish a revoked partition's records and commit its offsets before the group moves it")
	}
	p, err := Handle(db, name, h, cfg)
	if err != nil {
		return nil, err
	}
	c := newConsumer(p, client, false)
	c.lanes, c.watch = map[partition]*lane{}, watchOf(client)
	return c, nil
}

// newConsumer returns the Consumer running p on client. A routing p's
// runner keeps its own rows (heartbeats) in the fallback target.
func newConsumer(p *Processor, client *kgo.Client, share bool) *Consumer {
	c := &Consumer{proc: p, client: client, db: p.db, name: p.name, cfg: p.cfg, log: p.log, share: share}
	if p.route != nil {
		c.db, c.cfg.Schema = p.route.fallback.db, p.route.fallback.cfg.Schema
	}
	return c
}

// Processor returns the consumer's Processor, for Replay, Discard and
// ResolveGap.
func (c *Consumer) Processor() *Processor { return c.proc }

// Run consumes until ctx ends, then stops taking new records, lets the ones
// in flight finish (up to [Config.ShutdownGrace]), commits the offsets of
// everything applied, and returns nil. It does not close the client. It
// returns ErrClosed if the client was closed, ErrRunning when called a
// second time (a Consumer runs once), and an error when another Consumer
// runs on the same client.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	if _, taken := runners.LoadOrStore(c.client, c); taken {
		return errors.New("consumer: another Consumer is running on this client; give each Consumer a client of its own")
	}
	defer runners.Delete(c.client)
	if err := c.proc.CheckSchema(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		if c.proc.route == nil || errors.Is(err, outbox.ErrNotMigrated) {
			return err
		}
		// One target out of many unreachable: its records wait (and pin
		// their partitions' offsets) until it answers; the others go on.
		c.log.WarnContext(ctx, "consumer: a target database did not answer at start; its records are retried until it does", slog.String("error", err.Error()))
	}
	c.logStart(ctx)
	if parts := takeEarly(c.client); len(parts) > 0 {
		c.logPartitions(ctx, "assigned", parts)
	}
	if warnings, err := c.CheckRetention(ctx); err != nil {
		c.log.WarnContext(ctx, "consumer: could not check key retention against topic retention", slog.String("error", err.Error()))
	} else {
		for _, w := range warnings {
			c.log.WarnContext(ctx, "consumer: "+w.Message, slog.String("kind", string(w.Kind)))
		}
	}

	// The pruner and the committer stop when Run returns, whatever the
	// reason; the committer after the lanes' last commit.
	var wg sync.WaitGroup
	defer wg.Wait()
	bg, stopBg := context.WithCancel(ctx)
	defer stopBg()
	if c.cfg.PruneInterval > 0 {
		wg.Go(func() { c.pruneLoop(bg) })
	}
	wg.Go(func() { c.memberLoop(bg) })
	if c.cfg.RequestPoll >= 0 {
		wg.Go(func() { _ = c.proc.ServeRequests(withOpenSet(bg, &c.open)) })
	}
	if c.share {
		return c.shareLoop(ctx)
	}
	wg.Go(func() { c.commitLoop(bg) })
	// The drainer stops with ctx: what it has not committed is rolled back
	// and drained again at the next start. A handler of its that ignores
	// its ctx is abandoned like a lane's.
	drainCtx, stopDrain := context.WithCancel(ctx)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		c.drainLoop(withOpenSet(drainCtx, &c.open))
	}()
	defer c.stopDrainer(ctx, stopDrain, drained)

	err := c.poll(ctx)
	c.mu.Lock()
	c.closing = true
	lanes := slices.Collect(maps.Values(c.lanes))
	clear(c.lanes)
	c.mu.Unlock()
	c.retire(context.WithoutCancel(ctx), lanes, false)
	return err
}

// logStart says at INFO that the Consumer runs: its name, group, topics
// and the settings that shape its throughput.
func (c *Consumer) logStart(ctx context.Context) {
	member, _ := c.client.GroupMetadata()
	c.log.InfoContext(ctx, "consumer: started", slog.String("group", c.groupName()), slog.String("member_id", member),
		slog.Bool("share_group", c.share), slog.Any("topics", c.client.GetConsumeTopics()),
		slog.Int("concurrency", c.cfg.Concurrency), slog.Int("batch_size", c.cfg.BatchSize),
		slog.String("schema", c.cfg.Schema))
	if !c.share {
		if bs, _ := c.client.OptValue(kgo.Balancers).([]kgo.GroupBalancer); len(bs) > 0 && !serverSideBalancer(bs[0]) {
			c.log.WarnContext(ctx, "consumer: the client's first balancer is "+bs[0].ProtocolName()+
				", so franz-go uses the classic group protocol, where a member that dies stops the whole group until its session times out; "+
				"list kgo.CooperativeStickyBalancer() (the default) or kgo.RangeBalancer() first to use the consumer group protocol (KIP-848)")
		}
	}
}

// serverSideBalancer reports whether franz-go runs the consumer group
// protocol (KIP-848) with b as the first balancer: it does with the sticky
// and range balancers only.
func serverSideBalancer(b kgo.GroupBalancer) bool {
	switch b.ProtocolName() {
	case "cooperative-sticky", "sticky", "range":
		return true
	}
	return false
}

// groupName is the client's consumer group, or its share group.
func (c *Consumer) groupName() string {
	if c.share {
		g, _ := c.client.OptValue(kgo.ShareGroup).(string)
		return g
	}
	g, _ := c.client.OptValue(kgo.ConsumerGroup).(string)
	return g
}

// poll feeds the lanes until ctx ends (nil) or the client is closed
// (ErrClosed). Between a poll and its AllowRebalance the group cannot
// revoke anything, so every record polled is of a partition this member
// owns, fetched under its current assignment.
//
// A lane full after a poll has its partition's fetching paused right after
// that poll, unless franz-go still holds records of the partition, which
// it would drop at the next poll and fetch and decode again after the
// resume. It takes a poll's records fetch by fetch and partition by
// partition, so only the last partition of a poll that returned
// MaxPollRecords records can have some left, and they come first in the
// next poll: that lane's pause waits until it has them (see pauser).
// Every other partition of the poll has nothing left buffered, and
// franz-go builds a broker's next fetch request only once its buffered
// fetch is taken, so the pause keeps the partition out of later requests
// too, except a request franz-go built as soon as the poll took its
// broker's last buffered records: a paused partition's records in that
// fetch are dropped and fetched again.
func (c *Consumer) poll(ctx context.Context) error {
	pz := c.newPauser()
	for {
		fetches := c.client.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() {
			// A poll of a closed client counts as a poll too: without
			// this, the client's LeaveGroup would wait for it forever.
			c.client.AllowRebalance()
			return ErrClosed
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				c.log.WarnContext(ctx, "consumer: fetch failed", slog.String("topic", topic), slog.Int("partition", int(partition)), slog.String("error", err.Error()))
			}
		})
		c.mu.Lock()
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			if c.closing {
				return
			}
			tp := partition{p.Topic, p.Partition}
			l := c.lanes[tp]
			if l == nil {
				l = newLane(c, tp)
				c.lanes[tp] = l
			}
			l.add(p.Records)
			pz.fed(l, p.Records)
		})
		c.mu.Unlock()
		pz.polled(fetches.NumRecords() >= c.cfg.MaxPollRecords)
		c.client.AllowRebalance()
		if ctx.Err() != nil {
			return nil
		}
	}
}

func (c *Consumer) pruneLoop(ctx context.Context) {
	every(ctx, c.cfg.PruneInterval, func() {
		n, err := c.proc.PruneKeys(ctx)
		if err != nil && ctx.Err() == nil {
			c.log.WarnContext(ctx, "consumer: prune processed keys failed", slog.String("error", err.Error()))
		} else if n > 0 {
			c.log.InfoContext(ctx, "consumer: pruned processed keys", slog.Int64("deleted", n))
		}
	})
}
