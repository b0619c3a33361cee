package producer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/backoff"
	"github.com/d419a114/outbox/internal/tables"
)

// DeadPolicy says what happens to an aggregate's later events when one of
// its events exhausts its attempts.
type DeadPolicy int

const (
	// HoldAggregate keeps the aggregate's later events back until the dead
	// event is replayed or discarded, so consumers never see a gap.
	HoldAggregate DeadPolicy = iota
	// SkipDead publishes the later events at once; consumers that check
	// sequences see a gap where the dead event was.
	SkipDead
)

// RelayConfig tunes a Relay. The zero value is valid: every field has a
// default.
type RelayConfig struct {
	// Schema holds the outbox tables. Default outbox.DefaultSchema.
	Schema string
	// Topic receives events written without a topic of their own. Default:
	// the event's aggregate type.
	Topic string
	// BatchSize is how many events one claim takes. Default 1000.
	BatchSize int
	// PollInterval is the safety-net poll: a lost notification delays an
	// event by at most this much. Default 1s.
	PollInterval time.Duration
	// Lease is how long a claimed event stays reserved for this relay while
	// it publishes; the relay renews it every third of a lease while it
	// waits for the broker. If the relay dies, the aggregates of the events
	// it had claimed wait for the lease to end (the relay that takes their
	// bucket over holds them until then, and logs so at WARN); its other
	// aggregates are taken over at the next rebalance. Must exceed
	// PublishTimeout. Default 5s.
	Lease time.Duration
	// PublishTimeout bounds the wait for one batch's acknowledgements.
	// Records the client has not sent yet fail at the timeout and are
	// retried with backoff; records already in flight are waited for,
	// however long it takes, since the client cannot know whether they
	// landed; the batch's lease is renewed meanwhile. Default 2s.
	PublishTimeout time.Duration
	// MaxAttempts is how many permanent broker errors (record too large,
	// invalid topic, not authorised) an event may collect before it moves
	// to the dead events. Retryable errors (broker down, leader moving,
	// time-outs) are retried with backoff for as long as they last and do
	// not count. Default 10.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the delay before an event that failed
	// is tried again; it doubles per attempt, with jitter. Defaults 100ms
	// and 1m.
	MinBackoff, MaxBackoff time.Duration
	// OnDead says what happens to the later events of an aggregate whose
	// event went dead. Default HoldAggregate.
	OnDead DeadPolicy
	// MaxRecordBytes is the largest record, as Kafka counts it (see
	// [WriterConfig.MaxRecordBytes]), that the relay must be able to send:
	// NewRelay refuses a client that cannot send one to Topic (its
	// kgo.ProducerBatchMaxBytes, kgo.BrokerMaxWriteBytes or
	// kgo.MaxBufferedBytes are smaller). Give it the writers' value.
	// Whatever it says, a record the client would refuse is never handed
	// to it: it fails as a permanent error, and its aggregate's later
	// events wait behind it. Default DefaultMaxRecordBytes.
	MaxRecordBytes int
	// RelayID names this instance in logs and in the relays table. Default:
	// host name, process id and a random suffix.
	RelayID string
	// RebalanceInterval is how often the relay renews its heartbeat and
	// rebalances buckets with the other instances. An instance whose
	// process dies is noticed at the others' next rebalance, once the
	// server ended its session; one whose host vanished (its session
	// lingers until the server's TCP keepalive gives up) after three
	// intervals without a heartbeat. An instance that owns no bucket for
	// five intervals (at most 30s) while events wait says so at WARN, and
	// again every 30s while that lasts. Give every instance of one schema
	// the same value. Default 2s.
	RebalanceInterval time.Duration
	// Retention is how long delivered events are kept before they are
	// pruned; negative disables pruning. Default 7 days.
	Retention time.Duration
	// RetentionInterval is how often pruning runs. Default 1m.
	RetentionInterval time.Duration
	// SessionConfig is used for the two session connections a relay holds:
	// one for LISTEN and one that holds its bucket locks and claims. Both
	// need a real session: through PgBouncer in transaction mode, point this
	// at the server directly (or at a session-mode pool), and keep the pool
	// behind the pooler. Each time the relay connects its lock session it
	// checks that it is one (a direct connection costs one query; behind a
	// pooler the check opens one more connection for a moment), and Run
	// returns an error wrapping outbox.ErrNotSession when it is not.
	// Default: the pool's connection config.
	SessionConfig *pgx.ConnConfig
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
	// Tracer observes publishing (and, when it implements them, claims,
	// rebalances, the listener and pruning), for tracing and metrics
	// adapters. Default nil.
	Tracer RelayTracer
}

// Relay publishes committed outbox events to Kafka, at least once, and marks
// them delivered.
//
// Events are spread over a fixed number of buckets by a hash of their
// aggregate; each bucket is owned by one relay instance at a time through a
// session advisory lock, and instances rebalance buckets as they come and
// go. Within its buckets a relay publishes in id order, never holding a
// transaction across a network call, and per aggregate it never puts seq
// n+1 on the wire before seq n was acknowledged.
type Relay struct {
	pool   *pgxpool.Pool
	client *kgo.Client
	cfg    RelayConfig
	log    *slog.Logger
	sql    tables.Relay
	// dispatch reads the schema's dispatch mode (checkDispatch).
	dispatch tables.Dispatch
	retry    backoff.Policy
	// lockKey namespaces the bucket locks by schema.
	lockKey int32
	// health is what Health returns; the goroutine running Run stores it.
	health atomic.Pointer[RelayHealth]
	// trace is cfg.Tracer under each interface it implements.
	trace relayTracers
	// limit is what the client sends; publish hands it no larger record.
	limit clientLimit
	// failing is [RelayHealth.FailingTopics]; publish's goroutines write it.
	failing failingTopics
	// activityPruned is when (unix seconds) a mark batch last pruned the
	// activity table.
	activityPruned atomic.Int64
	// shared is set for a Fleet's shard: the session, listener and name it
	// shares with the fleet; nil for a Relay of its own.
	shared *fleetServer
}

// NewRelay validates cfg (nil means defaults) and returns a Relay that
// publishes through client. The client must keep idempotent writes (the
// default): the relay relies on them for per-partition order across
// retries. Records are keyed by aggregate id, so keep a key-hashing
// partitioner (the default). While a batch is published the relay
// flushes the client, so that nothing lingers; a client shared with other
// producers has their records sent at once meanwhile too, but the batch
// waits only for its own.
//
// A topic that does not exist is a retryable error to Kafka: its events
// are retried with backoff until it is created (the age alert on
// [Health.OldestUndelivered] fires meanwhile), and only their own
// aggregates wait.
func NewRelay(pool *pgxpool.Pool, client *kgo.Client, cfg *RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("producer: NewRelay needs a pool; got nil")
	}
	if client == nil {
		return nil, errors.New("producer: NewRelay needs a kgo.Client; got nil")
	}
	if v, ok := client.OptValue(kgo.DisableIdempotentWrite).(bool); ok && v {
		return nil, errors.New("producer: client has idempotent writes disabled, which lets retries reorder an aggregate's events; create it without kgo.DisableIdempotentWrite()")
	}
	c := RelayConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = outbox.DefaultSchema
	}
	if err := tables.CheckSchema(c.Schema); err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	setDefault(&c.BatchSize, 1000)
	setDefault(&c.PollInterval, time.Second)
	setDefault(&c.Lease, 5*time.Second)
	setDefault(&c.PublishTimeout, 2*time.Second)
	setDefault(&c.MaxAttempts, 10)
	setDefault(&c.MaxRecordBytes, DefaultMaxRecordBytes)
	setDefault(&c.MinBackoff, 100*time.Millisecond)
	setDefault(&c.MaxBackoff, time.Minute)
	setDefault(&c.RebalanceInterval, 2*time.Second)
	setDefault(&c.Retention, 7*24*time.Hour)
	setDefault(&c.RetentionInterval, time.Minute)
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"PollInterval", c.PollInterval}, {"Lease", c.Lease}, {"PublishTimeout", c.PublishTimeout}, {"MinBackoff", c.MinBackoff},
		{"MaxBackoff", c.MaxBackoff}, {"RebalanceInterval", c.RebalanceInterval}, {"RetentionInterval", c.RetentionInterval}} {
		if d.v < 0 {
			return nil, fmt.Errorf("producer: %s is negative (%s); leave it zero for the default", d.name, d.v)
		}
	}
	if c.MaxAttempts > math.MaxInt32 {
		return nil, fmt.Errorf("producer: MaxAttempts (%d) is above %d, the attempts column's range", c.MaxAttempts, math.MaxInt32)
	}
	if c.BatchSize < 0 || c.MaxAttempts < 0 || c.MaxRecordBytes < 0 {
		return nil, fmt.Errorf("producer: BatchSize (%d), MaxAttempts (%d) and MaxRecordBytes (%d) must not be negative; leave them zero for the defaults", c.BatchSize, c.MaxAttempts, c.MaxRecordBytes)
	}
	limit := limitOf(client)
	if err := limit.checkClientLimit(c.MaxRecordBytes, c.Topic); err != nil {
		return nil, err
	}
	if c.Lease <= c.PublishTimeout {
		return nil, fmt.Errorf("producer: Lease (%s) must exceed PublishTimeout (%s), or another instance could take over events still being published", c.Lease, c.PublishTimeout)
	}
	if c.MinBackoff > c.MaxBackoff {
		return nil, fmt.Errorf("producer: MinBackoff (%s) exceeds MaxBackoff (%s)", c.MinBackoff, c.MaxBackoff)
	}
	if c.RelayID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.RelayID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	if c.SessionConfig == nil {
		c.SessionConfig = pool.Config().ConnConfig
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	sql := tables.ProducerFor(c.Schema)
	return &Relay{
		pool:     pool,
		client:   client,
		cfg:      c,
		log:      c.Logger.With(slog.String("relay_id", c.RelayID)),
		sql:      sql.Relay,
		dispatch: sql.Dispatch,
		retry:    backoff.Policy{Min: c.MinBackoff, Max: c.MaxBackoff},
		lockKey:  schemaLockKey(c.Schema),
		trace:    newRelayTracers(c.Tracer),
		limit:    limit,
	}, nil
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Run publishes until ctx ends. It then stops claiming, lets the batch in
// flight finish and be marked, releases its buckets and returns nil: like
// Consumer.Run, a stop through ctx is a clean stop, whatever ctx's cause.
// Database and broker errors are logged and retried, never returned: a
// relay outlives outages. Run it once per Relay.
//
// On a schema dispatched by change data capture (SetDispatch with
// DispatchCDC) Run returns an error wrapping ErrCDCDispatch at once, and a
// running relay whose schema is switched stops within a RebalanceInterval
// the same way: the connector publishes, and a relay beside it would only
// send everything twice.
//
// Run returns an error wrapping outbox.ErrNotSession, before it publishes
// anything, when SessionConfig leads to a transaction pooler rather than
// to a session of its own (see [RelayConfig.SessionConfig]).
func (r *Relay) Run(ctx context.Context) error {
	if err := r.checkDispatch(ctx); err != nil {
		return err
	}
	wake := make(chan struct{}, 1)
	lctx, stopListener := context.WithCancel(ctx)
	var sess *lockSession
	if r.shared != nil {
		sess = r.shared.session
		r.shared.listener.add(r.cfg.Schema, wake)
		defer r.shared.listener.remove(r.cfg.Schema, wake)
		defer stopListener()
	} else {
		sess = r.newSession()
		listenerDone := make(chan struct{})
		go func() {
			defer close(listenerDone)
			r.listen(lctx, wake)
		}()
		defer func() {
			stopListener()
			<-listenerDone
		}()
	}

	if r.cfg.Retention > 0 {
		pruneDone := make(chan struct{})
		go func() {
			defer close(pruneDone)
			r.prune(lctx)
		}()
		defer func() {
			stopListener()
			<-pruneDone
		}()
	}

	owner := newBucketOwner(r, sess)
	defer owner.close()
	l := &loop{r: r, owner: owner, wake: wake}
	defer l.landInFlight(ctx)
	for ctx.Err() == nil && l.stopped == nil {
		l.step(ctx)
	}
	return l.stopped
}

// newSession returns the lock session of a Relay of its own.
func (r *Relay) newSession() *lockSession {
	return newLockSession(r.cfg.SessionConfig, r.checkSession, r.sql.ClaimSession, false)
}

// checkDispatch returns an error wrapping ErrCDCDispatch when the schema
// is dispatched by change data capture. A failure to read the mode is
// logged and counts as relay mode: the database may be down for a moment,
// and in CDC mode the relay finds nothing to claim anyway (events are
// written as published).
func (r *Relay) checkDispatch(ctx context.Context) error {
	st, err := readDispatch(ctx, r.pool, r.dispatch, r.cfg.Schema)
	if err != nil {
		r.logError(ctx, "relay: read the dispatch mode, will check again at the next rebalance", err)
		return nil
	}
	if st.Mode == DispatchCDC {
		return fmt.Errorf("%w: schema %q is in CDC mode (slot %q, since %s); stop this relay, or switch back with producer.SetDispatch(ctx, db, producer.DispatchRelay, ...)",
			ErrCDCDispatch, r.cfg.Schema, st.Slot, st.ChangedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// idleSettle is how long after going idle the relay looks for work one
// last time before it sleeps until notified. It covers writers that asked
// whether a relay was idle just before the flag was set, or skipped asking
// for wakeQuietFor because the last writer to ask found none, and that
// committed after the relay's immediate second look. A write missed even so
// (its transaction ran on for longer after Write) waits one PollInterval.
const idleSettle = 2 * wakeQuietFor

// busyLinger is how long after its last batch a relay keeps looking for
// work before it calls itself idle. Going idle asks writers to notify, and
// a relay that went idle after every few events would update its flag
// twice per flip, each a commit of its own, with writers notifying in
// between, which costs the writers throughput (BenchmarkWrite, write+relay;
// docs/performance.md). While it lingers, writers do not notify, so the
// wait between its looks is the latency of the events that arrive: it
// looks again firstBusyPoll after an empty claim, twice, then after twice
// as long every second time, up to busyPoll (1, 1, 2, 2, 4, 4, 5, 5 ms...;
// or as long as the last claim took, if longer). A steady flow of events
// meets a relay that has just looked (BenchmarkEndToEnd at 300 events/s),
// while lingering after traffic stops costs about 23 empty claims in
// busyLinger, against 20 at a steady busyPoll.
const (
	busyLinger    = 100 * time.Millisecond
	firstBusyPoll = time.Millisecond
	busyPoll      = 5 * time.Millisecond
)

// prune runs Prune every RetentionInterval until ctx ends, apart from the
// publishing loop so that a long prune never delays delivery.
func (r *Relay) prune(ctx context.Context) {
	for {
		res, err := Prune(ctx, r.pool, &PruneConfig{Schema: r.cfg.Schema, Retention: r.cfg.Retention})
		if r.trace.prune != nil && ctx.Err() == nil {
			r.trace.prune.TracePrune(ctx, res, err)
		}
		if err != nil {
			r.logError(ctx, "relay: prune delivered events, will retry", err)
		} else if res != (PruneResult{}) {
			r.log.InfoContext(ctx, "relay: pruned delivered events", slog.Int64("deleted", res.Deleted),
				slog.Int("partitions_created", res.PartitionsCreated), slog.Int("partitions_dropped", res.PartitionsDropped))
		}
		r.sleep(ctx, nil, r.cfg.RetentionInterval)
		if ctx.Err() != nil {
			return
		}
	}
}

// sleep waits for a wake-up, the timeout or the end of ctx.
func (r *Relay) sleep(ctx context.Context, wake <-chan struct{}, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-wake:
	case <-t.C:
	}
}

// flight is a claimed batch being published and settled by a goroutine of
// its own, so that the relay can claim the next batch meanwhile. The next
// claim leaves out every aggregate of the batch in flight (by the hash the
// buckets use, so a collision only leaves out more), so no aggregate is
// ever in two batches at once: pipelining keeps per-aggregate order.
type flight struct {
	batch []*claimedEvent
	// unrecorded receives once whether the outcome could not be recorded.
	unrecorded chan bool
}

// aggregates returns the bucket hashes of the flight's aggregates; none for
// a nil flight.
func (f *flight) aggregates() []int32 {
	if f == nil {
		return []int32{}
	}
	hashes := make([]int32, len(f.batch))
	for i, e := range f.batch {
		hashes[i] = e.bucketHash
	}
	return hashes
}

// launch publishes and settles the batch in a new goroutine. Once claimed,
// a batch is always published and settled, even if ctx ends meanwhile.
func (r *Relay) launch(ctx context.Context, batch []*claimedEvent) *flight {
	f := &flight{batch: batch, unrecorded: make(chan bool, 1)}
	finish := context.WithoutCancel(ctx)
	go func() {
		recs := make([]*kgo.Record, len(batch))
		for i, e := range batch {
			recs[i] = r.record(e, r.topicFor(e))
		}
		pctx := finish
		if r.trace.publish != nil {
			pctx = r.trace.publish.TracePublishStart(finish, recs)
		}
		published := make(chan []outcome, 1)
		go func() { published <- r.publish(pctx, batch, recs) }()
		results, lease := r.awaitPublish(finish, batch, published)
		res, err := r.settle(finish, batch, results, lease)
		if err != nil {
			r.logError(ctx, "relay: gave up recording a batch's outcome; pausing until its lease ends", err)
		}
		if r.trace.publish != nil {
			r.trace.publish.TracePublishEnd(pctx, recs, res, err)
		}
		f.unrecorded <- err != nil
	}()
	return f
}

// land waits for the flight to end. If its outcome could not be recorded,
// the flight's aggregates are held until its lease ends (see holdBatch).
// The bound is local time, Lease from now: the lease it waits out was set
// or renewed by the server before now, so it ends before that.
func (r *Relay) land(ctx context.Context, owner *bucketOwner, f *flight) {
	if <-f.unrecorded {
		owner.holdBatch(ctx, f.batch, time.Now().Add(r.cfg.Lease))
	}
}

// awaitPublish waits for the batch's outcome, renewing the batch's lease
// every third of a lease meanwhile: the client does not give up on a record
// that may have reached the broker, so a publish can last longer than
// PublishTimeout, and its rows must stay reserved until it ends. It returns
// the outcome and the lease the rows now carry.
func (r *Relay) awaitPublish(ctx context.Context, batch []*claimedEvent, published <-chan []outcome) ([]outcome, time.Time) {
	lease := batch[0].leasedUntil
	tick := time.NewTicker(r.cfg.Lease / 3)
	defer tick.Stop()
	var ids []int64
	for {
		select {
		case results := <-published:
			return results, lease
		case <-tick.C:
			if ids == nil {
				ids = make([]int64, len(batch))
				for i, e := range batch {
					ids[i] = e.id
				}
			}
			var renewed *time.Time
			err := r.pool.QueryRow(ctx, r.sql.RenewLease, ids, lease, r.cfg.Lease.Milliseconds()).Scan(&renewed)
			switch {
			case err != nil:
				r.logError(ctx, "relay: renew the lease of a batch still being published", err)
			case renewed != nil:
				lease = *renewed
				r.log.WarnContext(ctx, "relay: the broker has not answered for a batch yet; renewed its lease",
					slog.Int("events", len(batch)), slog.Time("leased_until", lease), r.waitingOn(batch))
			}
		}
	}
}

func (r *Relay) logError(ctx context.Context, msg string, err error) {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return
	}
	r.log.WarnContext(ctx, msg, slog.String("error", err.Error()))
}
