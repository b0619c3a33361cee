package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ClientOpts are the options a client needs to be given to New, on top of
// the user's own (seed brokers, kgo.ConsumerGroup, kgo.ConsumeTopics):
// offsets are committed by the Consumer after the database commit, never
// automatically, and a rebalance waits until the records already polled
// are processed.
func ClientOpts() []kgo.Opt {
	return []kgo.Opt{kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll()}
}

// Consumer runs a Processor over a franz-go consumer group: records of a
// partition strictly in offset order, partitions in parallel (one goroutine
// per partition with records in the current poll; in batch mode, a poll of
// no more than BatchSize records in one transaction), offsets committed
// only after the database commit, after each poll's records are done and
// before any rebalance can proceed.
//
// The client must be created with ClientOpts. Because of
// kgo.BlockRebalanceOnPoll, a partition is handed to another member only
// between polls, when none of its records is in flight and its offsets are
// committed: no record is processed by two members at once (unless this
// member loses its partitions by missing the session timeout, in which case
// dedupe still keeps effects single). A slow partition delays the next poll
// of the others; keep handlers fast or use BatchSize. A record that is not
// done (the database is down, or under ordering.GapFail its gap is open) is
// retried with backoff without moving on, which holds the poll round and so
// rebalances until it is done or ctx ends.
type Consumer struct {
	proc   *Processor
	client *kgo.Client
	db     DB
	cfg    Config
	log    *slog.Logger
	// running guards against two Runs.
	running atomic.Bool
}

// New returns a Consumer that applies the records of client's group through
// h for the consumer name. See Handle for db and name. New fails if the
// client has no consumer group, has auto-commit enabled, or does not block
// rebalances during processing; the error says which option to add.
func New(db DB, client *kgo.Client, name string, h Handler, cfg *Config) (*Consumer, error) {
	if client == nil {
		return nil, errors.New("consumer: nil client")
	}
	if g, _ := client.OptValue(kgo.ConsumerGroup).(string); g == "" {
		return nil, errors.New("consumer: client has no consumer group; create it with kgo.ConsumerGroup(name) and kgo.ConsumeTopics(...)")
	}
	if off, _ := client.OptValue(kgo.DisableAutoCommit).(bool); !off {
		return nil, errors.New("consumer: client has auto-commit enabled; create it with kgo.DisableAutoCommit() (see consumer.ClientOpts): offsets must be committed only after the database commit")
	}
	if block, _ := client.OptValue(kgo.BlockRebalanceOnPoll).(bool); !block {
		return nil, errors.New("consumer: client lets a rebalance revoke partitions while their records are processed; create it with kgo.BlockRebalanceOnPoll() (see consumer.ClientOpts)")
	}
	p, err := Handle(db, name, h, cfg)
	if err != nil {
		return nil, err
	}
	return &Consumer{proc: p, client: client, db: db, cfg: p.cfg, log: p.log}, nil
}

// Processor returns the consumer's Processor, for Replay, Discard and
// ResolveGap.
func (c *Consumer) Processor() *Processor { return c.proc }

// Run consumes until ctx ends, then stops taking new records, lets the ones
// in flight finish (up to Config.ShutdownGrace), commits the offsets of everything
// applied, and returns nil. It does not close the client. It returns
// ErrClosed if the client was closed, and ErrRunning when called a second
// time: a Consumer runs once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	if warnings, err := c.CheckRetention(ctx); err != nil {
		c.log.WarnContext(ctx, "consumer: could not check key retention against topic retention", slog.String("error", err.Error()))
	} else {
		for _, w := range warnings {
			c.log.WarnContext(ctx, "consumer: "+w)
		}
	}

	// work outlives ctx by Config.ShutdownGrace, so that in-flight transactions
	// can commit after a shutdown was asked for.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var grace *time.Timer
	var graceMu sync.Mutex
	stopAfter := context.AfterFunc(ctx, func() {
		graceMu.Lock()
		grace = time.AfterFunc(c.cfg.ShutdownGrace, cancelWork)
		graceMu.Unlock()
	})
	defer func() {
		stopAfter()
		graceMu.Lock()
		if grace != nil {
			grace.Stop()
		}
		graceMu.Unlock()
	}()

	// The pruner stops when Run returns, whatever the reason.
	var wg sync.WaitGroup
	defer wg.Wait()
	pruneCtx, stopPrune := context.WithCancel(ctx)
	defer stopPrune()
	if c.cfg.PruneInterval > 0 {
		wg.Go(func() { c.pruneLoop(pruneCtx) })
	}
	// The drainer stops with ctx: what it has not committed is rolled back
	// and drained again at the next start. A handler of its that ignores
	// its ctx is abandoned like a round's.
	drainCtx, stopDrain := context.WithCancel(ctx)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		c.drainLoop(drainCtx)
	}()
	defer c.stopDrainer(ctx, stopDrain, drained)

	for {
		fetches := c.client.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() {
			c.client.AllowRebalance()
			return ErrClosed
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				c.log.WarnContext(ctx, "consumer: fetch failed", slog.String("topic", topic), slog.Int("partition", int(partition)), slog.String("error", err.Error()))
			}
		})
		finished := c.roundWithin(ctx, work, fetches)
		c.client.AllowRebalance()
		if !finished || ctx.Err() != nil {
			return nil
		}
	}
}

// abandonAfter is how long Run waits, once ShutdownGrace is over and the
// handlers' contexts are cancelled, for a handler that ignores its ctx.
const abandonAfter = time.Second

// roundWithin runs round and waits for it, except at shutdown: once work
// ends (ShutdownGrace after ctx) it waits abandonAfter more, then ends the
// database sessions of the transactions still open (the server rolls them
// back, so nothing they did commits, and their records are redelivered)
// and returns false without waiting for the handlers that hold them. Those
// keep their goroutines until they return, and then find their
// transactions gone; the round commits no offsets after that.
func (c *Consumer) roundWithin(ctx, work context.Context, fetches kgo.Fetches) bool {
	var abandoned atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.round(ctx, work, fetches, &abandoned)
	}()
	select {
	case <-done:
		return true
	case <-work.Done():
	}
	t := time.NewTimer(abandonAfter)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	}
	abandoned.Store(true)
	pids := c.proc.inFlight()
	c.log.ErrorContext(ctx, "consumer: handlers did not return after ShutdownGrace and the cancel of their contexts; rolling back their transactions and returning without them",
		slog.Duration("shutdown_grace", c.cfg.ShutdownGrace), slog.Int("transactions", len(pids)))
	if err := c.proc.terminate(context.WithoutCancel(ctx), pids); err != nil {
		c.log.ErrorContext(ctx, "consumer: could not end the sessions of abandoned transactions; they end when their handlers return",
			slog.String("error", err.Error()))
	}
	return false
}

// stopDrainer cancels the drainer and waits for it, at most abandonAfter,
// then ends the sessions of whatever transactions are still open.
func (c *Consumer) stopDrainer(ctx context.Context, stop context.CancelFunc, drained <-chan struct{}) {
	stop()
	t := time.NewTimer(abandonAfter)
	defer t.Stop()
	select {
	case <-drained:
		return
	case <-t.C:
	}
	if err := c.proc.terminate(context.WithoutCancel(ctx), c.proc.inFlight()); err != nil {
		c.log.ErrorContext(ctx, "consumer: could not end the sessions of the drainer's transactions; they end when its handler returns",
			slog.String("error", err.Error()))
	}
}

// round processes one poll's records, one goroutine per partition, then
// marks and commits what was done, unless Run abandoned it. It returns when
// every partition's goroutine has.
func (c *Consumer) round(ctx, work context.Context, fetches kgo.Fetches, abandoned *atomic.Bool) {
	var parts [][]*kgo.Record
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) > 0 {
			parts = append(parts, p.Records)
		}
	})
	if len(parts) == 0 {
		return
	}
	done := make([]*kgo.Record, len(parts))
	var (
		applied bool
		failed  *Message
		ferr    error
	)
	if together, ok := c.together(parts); ok {
		// A poll this small goes in one transaction: at low rates a poll
		// holds a record or two of each partition, and one transaction
		// for all of them costs far less than one per partition.
		if applied, failed, ferr = c.proc.tryBatch(work, together); applied {
			for i, recs := range parts {
				done[i] = recs[len(recs)-1]
			}
		}
	}
	if !applied {
		var wg sync.WaitGroup
		for i, recs := range parts {
			// After a failed Handle only its partition's records go one
			// by one; after a failed HandleBatch, which blames no record,
			// every partition's do.
			var f *Message
			var fe error
			switch {
			case failed != nil && slices.Contains(recs, failed.Record):
				f, fe = failed, ferr
			case failed == nil:
				fe = ferr
			}
			wg.Go(func() { done[i] = c.partition(ctx, work, recs, f, fe) })
		}
		wg.Wait()
	}
	var marks []*kgo.Record
	for _, r := range done {
		if r != nil {
			marks = append(marks, r)
		}
	}
	if len(marks) == 0 || abandoned.Load() {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	// CommitRecords commits each partition's last applied record + 1.
	if err := c.client.CommitRecords(cctx, marks...); err != nil {
		// Not fatal: the records are applied and dedupe makes their
		// redelivery harmless; the next round commits again.
		c.log.WarnContext(ctx, "consumer: commit offsets failed", slog.String("error", err.Error()))
	}
}

// together returns the records of parts in one slice, each partition's in
// offset order, when batch mode is on, the poll spans several partitions
// and it holds no more than BatchSize records in all.
func (c *Consumer) together(parts [][]*kgo.Record) ([]*kgo.Record, bool) {
	if c.cfg.BatchSize < 2 || len(parts) < 2 {
		return nil, false
	}
	n := 0
	for _, recs := range parts {
		n += len(recs)
	}
	if n > c.cfg.BatchSize {
		return nil, false
	}
	all := make([]*kgo.Record, 0, n)
	for _, recs := range parts {
		all = append(all, recs...)
	}
	return all, true
}

// partition processes recs (one partition's, in offset order) and returns
// the last record done. It stops early only when ctx ends: it takes no new
// record then, and a record in flight may finish within work. ferr, when
// not nil, says that recs were in a transaction that was rolled back
// because a handler failed (see Consumer.together), and recs, which then
// fit in one chunk, are processed one by one: failed, when not nil, is the
// record of recs whose Handle failed with ferr, which counts as its first
// attempt; nil, HandleBatch failed.
func (c *Consumer) partition(ctx, work context.Context, recs []*kgo.Record, failed *Message, ferr error) *kgo.Record {
	var last *kgo.Record
	for len(recs) > 0 && ctx.Err() == nil {
		chunk := recs[:min(c.cfg.BatchSize, len(recs))]
		for attempt := 1; len(chunk) > 0; attempt++ {
			var (
				res []Result
				err error
			)
			switch {
			case ferr != nil:
				res, err = c.proc.processBatchAfter(work, chunk, failed, ferr)
				failed, ferr = nil, nil
			case len(chunk) == 1:
				var r Result
				if r, err = c.proc.Process(work, chunk[0]); err == nil {
					res = []Result{r}
				}
			default:
				res, err = c.proc.ProcessBatch(work, chunk)
			}
			if len(res) > 0 {
				last = chunk[len(res)-1]
				chunk, recs = chunk[len(res):], recs[len(res):]
			}
			if err == nil {
				continue
			}
			if ctx.Err() != nil || work.Err() != nil {
				return last
			}
			// The record is not done: a database failure, or a gap under
			// GapFail. Retry it without moving on, so order holds.
			c.log.WarnContext(ctx, "consumer: record not done, retrying", slog.String("topic", chunk[0].Topic),
				slog.Int("partition", int(chunk[0].Partition)), slog.Int64("offset", chunk[0].Offset), slog.String("error", err.Error()))
			if sleep(ctx, c.proc.backoff(attempt)) != nil {
				return last
			}
		}
	}
	return last
}

func (c *Consumer) pruneLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := c.proc.PruneKeys(ctx)
		if err != nil && ctx.Err() == nil {
			c.log.WarnContext(ctx, "consumer: prune processed keys failed", slog.String("error", err.Error()))
		} else if n > 0 {
			c.log.InfoContext(ctx, "consumer: pruned processed keys", slog.Int64("deleted", n))
		}
	}
}

// CheckRetention compares Config.KeyRetention with the retention of the
// subscribed topics (read from the broker) and with Config.ReplayWindow,
// and returns a warning for each way a record could come back after its
// key was pruned, when it would be applied a second time. Run logs them at
// start.
func (c *Consumer) CheckRetention(ctx context.Context) ([]string, error) {
	var warnings []string
	keep := c.cfg.KeyRetention
	if c.cfg.ReplayWindow > keep {
		warnings = append(warnings, fmt.Sprintf("key retention %s is shorter than the dead-letter replay window %s: a replay after the key is pruned can apply an effect twice", keep, c.cfg.ReplayWindow))
	}
	topics := c.client.GetConsumeTopics()
	if len(topics) == 0 {
		return warnings, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	configs, err := kadm.NewClient(c.client).DescribeTopicConfigs(cctx, topics...)
	if err != nil {
		return warnings, fmt.Errorf("describe topic configs: %w", err)
	}
	for _, rc := range configs {
		if rc.Err != nil {
			return warnings, fmt.Errorf("describe topic %s: %w", rc.Name, rc.Err)
		}
		for _, cfg := range rc.Configs {
			if cfg.Key != "retention.ms" || cfg.Value == nil {
				continue
			}
			ms, err := strconv.ParseInt(*cfg.Value, 10, 64)
			if err != nil {
				continue
			}
			switch {
			case ms < 0:
				warnings = append(warnings, fmt.Sprintf("topic %s keeps records forever but processed keys are kept %s: a reset to an old offset applies effects again", rc.Name, keep))
			case time.Duration(ms)*time.Millisecond > keep:
				warnings = append(warnings, fmt.Sprintf("key retention %s is shorter than topic %s's retention %s: a redelivery after the key is pruned applies its effect again", keep, rc.Name, time.Duration(ms)*time.Millisecond))
			}
		}
	}
	return warnings, nil
}
