package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/mock/gomock"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
)

func TestNewRefusesUnsafeClients(t *testing.T) {
	t.Parallel()
	broker := kafkatest.New(t)
	h := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	tests := []struct {
		name    string
		opts    []kgo.Opt
		wantErr string
	}{
		{"NoGroup", []kgo.Opt{kgo.ConsumeTopics("t")}, "kgo.ConsumerGroup"},
		{"AutoCommit", []kgo.Opt{kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.BlockRebalanceOnPoll()}, "client has auto-commit enabled; create it with kgo.DisableAutoCommit()"},
		{"NoBlockOnPoll", []kgo.Opt{kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.DisableAutoCommit()}, "create it with kgo.BlockRebalanceOnPoll()"},
		{"NoCallbacks", []kgo.Opt{kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll()}, "consumer.ClientOpts()"},
		{"OwnCallback", append(append([]kgo.Opt{kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t")}, consumer.ClientOpts()...), kgo.OnPartitionsRevoked(func(context.Context, *kgo.Client, map[string][]int32) {})), "consumer.ClientOpts()"},
		{"Safe", append([]kgo.Opt{kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t")}, consumer.ClientOpts()...), ""},
	}
	t.Run("NilDatabase", func(t *testing.T) {
		t.Parallel()
		cl := broker.Client(t, append([]kgo.Opt{kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t")}, consumer.ClientOpts()...)...)
		_, err := consumer.New(nil, cl, "svc", h, nil)
		require.ErrorContains(t, err, "consumer: New needs", "the error names the function called")
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cl := broker.Client(t, tt.opts...)
			_, err := consumer.New(NewMockDB(gomock.NewController(t)), cl, "svc", h, nil)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// groupBundle is a topic, a database and the helpers to run consumers of
// one group on them.
type groupBundle struct {
	broker  *kafkatest.Broker
	db      *pgtest.DB
	topic   string
	group   string
	effects *effects
	// adm is the bundle's admin client, made on first use.
	admOnce sync.Once
	adm     *kadm.Client
}

// admin returns the bundle's admin client.
func (b *groupBundle) admin(t *testing.T) *kadm.Client {
	b.admOnce.Do(func() { b.adm = kadm.NewClient(b.broker.Client(t)) })
	return b.adm
}

func newGroupBundle(t *testing.T, partitions int32) *groupBundle {
	t.Helper()
	return newGroupBundleOn(t, kafkatest.New(t), partitions)
}

// newGroupBundleOn is newGroupBundle on broker.
func newGroupBundleOn(t *testing.T, broker *kafkatest.Broker, partitions int32) *groupBundle {
	t.Helper()
	b := &groupBundle{broker: broker, db: pgtest.New(t, &pgtest.Opts{MaxConns: 20})}
	b.topic = b.broker.Topic(t, partitions)
	b.group = "g-" + b.topic
	b.effects = newEffects(t, b.db)
	return b
}

func (b *groupBundle) produce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	cl := b.broker.Client(t, kgo.DefaultProduceTopic(b.topic), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
}

func (b *groupBundle) client(t *testing.T, group string) *kgo.Client {
	t.Helper()
	return b.broker.Client(t, append([]kgo.Opt{
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(b.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50 * time.Millisecond),
	}, consumer.ClientOpts()...)...)
}

// running is a Consumer running in the background.
type running struct {
	c      *consumer.Consumer
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan error
}

func (b *groupBundle) start(t *testing.T, h consumer.Handler, cfg *consumer.Config) *running {
	t.Helper()
	cl := b.client(t, b.group)
	c, err := consumer.New(b.db.Pool, cl, "svc", h, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cl: cl, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop shuts the consumer down gracefully and leaves the group.
func (r *running) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	require.NoError(t, <-r.done)
	r.cl.Close()
}

// committed returns the group's committed offsets summed over partitions.
func (b *groupBundle) committed(t *testing.T) int64 {
	t.Helper()
	adm := b.admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, b.group)
	if err != nil {
		return -1
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
	return sum
}

// stableWith returns a condition: the group is stable with n members,
// each with a partition assigned.
func (b *groupBundle) stableWith(t *testing.T, n int) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		groups, err := b.admin(t).DescribeConsumerGroups(ctx, b.group)
		if err != nil {
			return false
		}
		g := groups[b.group]
		if g.Err != nil || g.State != "Stable" || len(g.Members) != n {
			return false
		}
		for _, m := range g.Members {
			if len(m.Assignment) == 0 {
				return false
			}
		}
		return true
	}
}

// stream returns n records over aggs aggregates, each aggregate's sequence
// in order, keyed by aggregate.
func stream(aggs, n int) []*kgo.Record {
	var rs []*kgo.Record
	for i := range n {
		agg := fmt.Sprintf("agg-%d", i%aggs)
		seq := int64(i/aggs + 1)
		rs = append(rs, rec(agg, seq, fmt.Sprintf("%s-%d", agg, seq)))
	}
	return rs
}

func TestConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, mode := range runnerModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()

			// Every record produced twice, then everything consumed again
			// from the start under a new group (an offset reset), then a
			// crash between the database commit and the offset commit.
			t.Run("DuplicatesApplyOnce", func(t *testing.T) {
				t.Parallel()
				b := newGroupBundle(t, 3)
				recs := stream(6, 60)
				b.produce(t, recs...)
				b.produce(t, stream(6, 60)...)
				r := b.start(t, mode.handler(b.effects), mode.config(b.db))
				eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == 120 }, "all offsets committed")
				rows, distinct := b.effects.count(t)
				require.Equal(t, 60, rows)
				require.Equal(t, 60, distinct)
				r.stop(t)

				// Offsets reset: a new group reads everything again.
				b.group += "-reset"
				r = b.start(t, mode.handler(b.effects), mode.config(b.db))
				eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == 120 })
				r.stop(t)

				// Killed after the database commit, before the offset commit:
				// a plain poll loop applies records and never commits.
				b.group += "-crash"
				b.produce(t, stream(6, 66)[60:]...)
				cl := b.client(t, b.group)
				p, err := consumer.Handle(b.db.Pool, "svc", mode.handler(b.effects), mode.config(b.db))
				require.NoError(t, err)
				seen := 0
				pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				for seen < 126 && pctx.Err() == nil {
					fs := cl.PollRecords(pctx, 100)
					fs.EachPartition(func(part kgo.FetchTopicPartition) {
						_, err := p.ProcessBatch(pctx, part.Records)
						require.NoError(t, err)
						seen += len(part.Records)
					})
					cl.AllowRebalance()
				}
				require.Equal(t, 126, seen)
				cl.Close() // the "crash": nothing committed
				b.start(t, mode.handler(b.effects), mode.config(b.db))
				eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == 126 })
				rows, distinct = b.effects.count(t)
				require.Equal(t, 66, rows)
				require.Equal(t, 66, distinct)
				for i := range 6 {
					require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, b.effects.seqs(t, fmt.Sprintf("agg-%d", i)))
				}
			})

			// Members join and leave while records flow: no record is in two
			// handlers at once, effects apply once and in order.
			t.Run("RebalancesKeepEffectsSingleAndOrdered", func(t *testing.T) {
				t.Parallel()
				b := newGroupBundle(t, 4)
				g := newGuard(t, b.db, mode.handler(b.effects))
				// Each execution holds its aggregate a little, and agg-0's
				// hold it long, so that a record is in flight at every
				// revocation and two of agg-0's wait together. agg-0's
				// records carry no sequence, so that the database does not
				// serialise them (a sequenced aggregate's position row lock
				// would): only the runner keeps their executions apart.
				held := func(agg string) bool { return agg == "agg-0" }
				g.hold = func(m *consumer.Message) time.Duration {
					if held(m.AggregateID) {
						return 20 * time.Millisecond
					}
					return 2 * time.Millisecond
				}
				var h consumer.Handler = g
				if mode.batchHandler {
					h = batchGuard{g}
				}
				cfg := mode.config(b.db)
				m1 := b.start(t, h, cfg)
				// Records keep coming, 20 (two of each aggregate) every
				// 150ms, while members join and leave; each change waits for
				// the group to be stable and for records to be applied
				// after it.
				const aggs = 10
				all := stream(aggs, 20000)
				for i, r := range all {
					if agg := string(r.Key); held(agg) {
						all[i] = rec(agg, 0, fmt.Sprintf("%s-%d", agg, i/aggs+1))
					}
				}
				stopProducing := make(chan struct{})
				produced := make(chan int, 1)
				go func() {
					tick := time.NewTicker(150 * time.Millisecond)
					defer tick.Stop()
					n := 0
					defer func() { produced <- n }()
					for n < len(all) {
						select {
						case <-stopProducing:
							return
						case <-tick.C:
						}
						b.produce(t, all[n:n+20]...)
						n += 20
					}
				}()
				rows := func() int { n, _ := b.effects.count(t); return n }
				more := func(n int) func() bool {
					target := rows() + n
					return func() bool { return rows() >= target }
				}
				eventually.True(t, 30*time.Second, more(100))
				m2 := b.start(t, h, cfg) // joins
				eventually.True(t, 30*time.Second, b.stableWith(t, 2), "two members share the partitions")
				eventually.True(t, 30*time.Second, more(100))
				m3 := b.start(t, h, cfg) // joins
				eventually.True(t, 30*time.Second, b.stableWith(t, 3), "three members share the partitions")
				eventually.True(t, 30*time.Second, more(100))
				m1.stop(t) // leaves mid-stream
				eventually.True(t, 30*time.Second, b.stableWith(t, 2), "two members share the partitions")
				eventually.True(t, 30*time.Second, more(100))
				close(stopProducing)
				total := <-produced
				eventually.True(t, 60*time.Second, func() bool { return rows() == total }, "every record produced applied")
				m2.stop(t)
				m3.stop(t)
				require.Empty(t, g.overlaps(t), "executions of one aggregate overlapped")
				n, distinct := b.effects.count(t)
				require.Equal(t, total, n)
				require.Equal(t, total, distinct)
				want, wantKeys := make([]int64, total/aggs), make([]string, total/aggs)
				for i := range want {
					want[i], wantKeys[i] = int64(i+1), fmt.Sprintf("agg-0-%d", i+1)
				}
				require.Equal(t, wantKeys, b.effects.keys(t, "agg-0"), "agg-0 in offset order")
				for i := 1; i < aggs; i++ {
					require.Equal(t, want, b.effects.seqs(t, fmt.Sprintf("agg-%d", i)))
				}
			})

			// A poison aggregate, malformed records and huge values among
			// good ones: dead letters with reasons, and the runner goes on.
			t.Run("PoisonAndBadInputDoNotStopTheRunner", func(t *testing.T) {
				t.Parallel()
				b := newGroupBundle(t, 2)
				b.effects.setFail("bad", errBroken)
				cfg := mode.config(b.db)
				cfg.MaxValueBytes = 1024
				huge := rec("big", 0, "big")
				huge.Value = make([]byte, 4096)
				noKey := &kgo.Record{Key: []byte("nokey"), Value: []byte("x")}
				badSeq := rec("seq", 0, "seq")
				badSeq.Headers = append(badSeq.Headers, kgo.RecordHeader{Key: "outbox-aggregate-seq", Value: []byte("x\xff")})
				unknown := rec("xml", 0, "xml")
				unknown.Headers = append(unknown.Headers, kgo.RecordHeader{Key: "content-type", Value: []byte("application/xml")})
				recs := append(stream(5, 50), rec("bad", 1, "bad-1"), rec("bad", 2, "bad-2"), huge, noKey, badSeq, unknown, rec("bad", 3, "bad-3"))
				recs = append(recs, stream(5, 60)[50:]...)
				b.produce(t, recs...)
				// The handler accepts JSON only: unknown content is its
				// permanent error.
				b.effects.reject = func(m *consumer.Message) error {
					if m.ContentType != "" && m.ContentType != "application/json" {
						return consumer.Permanent(fmt.Errorf("unknown content type %q", m.ContentType))
					}
					return nil
				}
				b.start(t, mode.handler(b.effects), cfg)
				eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == int64(len(recs)) })
				rows, _ := b.effects.count(t)
				require.Equal(t, 60, rows)
				letters, err := mustInspector(t, b.db.Pool, b.db.Schema).Letters(ctx, nil)
				require.NoError(t, err)
				reasons := map[string]string{}
				for _, l := range letters {
					reasons[string(l.Record.Key)] = l.Error
				}
				require.Len(t, reasons, 5)
				require.Contains(t, reasons["xml"], `unknown content type "application/xml"`)
				require.Contains(t, reasons["bad"], "downstream broken")
				require.Contains(t, reasons["big"], "exceeds Config.MaxValueBytes")
				require.Contains(t, reasons["nokey"], "no idempotency key")
				require.Contains(t, reasons["seq"], "not UTF-8 text")
			})
		})
	}

	// In batch mode a partition's records waiting together go in one
	// transaction, which holds no other partition's; a failing record then
	// takes the records one at a time again, with no more handler runs
	// than single mode gives it.
	t.Run("BatchesStayInTheirPartition", func(t *testing.T) {
		t.Parallel()
		b := newGroupBundle(t, 4)
		var (
			mu    sync.Mutex
			parts = map[int64]map[int32]bool{} // transaction id -> partitions
			sizes = map[int64]int{}            // transaction id -> records
		)
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var txid int64
			if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&txid); err != nil {
				return err
			}
			mu.Lock()
			if parts[txid] == nil {
				parts[txid] = map[int32]bool{}
			}
			parts[txid][m.Partition] = true
			sizes[txid]++
			mu.Unlock()
			return b.effects.Handle(ctx, tx, m)
		})
		recs := stream(12, 12)
		b.produce(t, recs...)
		r := b.start(t, h, fastConfig(b.db, 50))
		eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == 12 }, "all offsets committed")
		r.stop(t)
		rows, distinct := b.effects.count(t)
		require.Equal(t, 12, rows)
		require.Equal(t, 12, distinct)
		mu.Lock()
		widest, longest := 0, 0
		for txid, ps := range parts {
			widest, longest = max(widest, len(ps)), max(longest, sizes[txid])
		}
		mu.Unlock()
		require.Equal(t, 1, widest, "each transaction holds one partition's records")
		require.Greater(t, longest, 1, "one transaction applied several records")

		// The same with a poison record among them, under a new group.
		b.effects.setFail("poison", errBroken)
		b.group += "-poison"
		b.produce(t, rec("poison", 1, "poison-1"), rec("poison", 2, "poison-2"))
		r = b.start(t, b.effects, fastConfig(b.db, 50))
		eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == 14 }, "all offsets committed")
		r.stop(t)
		rows, _ = b.effects.count(t)
		require.Equal(t, 12, rows, "the other records applied once")
		require.Equal(t, 3, b.effects.callsOf("poison-1"), "MaxAttempts handler runs, the batch's included")
		letters, err := mustInspector(t, b.db.Pool, b.db.Schema).Letters(ctx, nil)
		require.NoError(t, err)
		require.Len(t, letters, 1)
		require.Equal(t, 3, letters[0].Attempts)
		require.Equal(t, 0, b.effects.callsOf("poison-2"), "parked behind the dead letter")
	})

	t.Run("ShutdownCommitsWhatWasApplied", func(t *testing.T) {
		t.Parallel()
		b := newGroupBundle(t, 1)
		release := make(chan struct{})
		var once sync.Once
		entered := make(chan struct{})
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.AggregateID == "slow" {
				once.Do(func() { close(entered) })
				<-release
			}
			return b.effects.Handle(ctx, tx, m)
		})
		b.produce(t, append(stream(2, 10), rec("slow", 1, "slow-1"), rec("after", 1, "after-1"))...)
		r := b.start(t, h, fastConfig(b.db, 1))
		<-entered
		r.cancel() // shutdown while "slow" is in flight
		r.cancel = nil
		close(release)
		require.NoError(t, <-r.done)
		r.cl.Close()
		require.EqualValues(t, 11, b.committed(t), "the in-flight record finished and was committed; no new one started")
		rows, _ := b.effects.count(t)
		require.Equal(t, 11, rows)
	})

	t.Run("WarnsWhenKeysExpireBeforeTopicRecords", func(t *testing.T) {
		t.Parallel()
		broker := kafkatest.New(t)
		db := pgtest.New(t, nil)
		adm := kadm.NewClient(broker.Client(t))
		mk := func(retention string) string {
			name := fmt.Sprintf("ret-%s-%d", retention, time.Now().UnixNano())
			resp, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"retention.ms": &retention}, name)
			require.NoError(t, err)
			require.NoError(t, resp.Err)
			return name
		}
		long, short := mk(fmt.Sprint((30 * 24 * time.Hour).Milliseconds())), mk(fmt.Sprint(time.Hour.Milliseconds()))
		h := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
		check := func(topic string, cfg *consumer.Config) []consumer.RetentionWarning {
			cl := broker.Client(t, append([]kgo.Opt{kgo.ConsumerGroup("g"), kgo.ConsumeTopics(topic)}, consumer.ClientOpts()...)...)
			c, err := consumer.New(db.Pool, cl, "svc", h, cfg)
			require.NoError(t, err)
			w, err := c.CheckRetention(ctx)
			require.NoError(t, err)
			return w
		}
		w := check(long, nil)
		require.Len(t, w, 1)
		require.Equal(t, consumer.RetentionTopicLonger, w[0].Kind)
		require.Equal(t, long, w[0].Topic)
		require.Contains(t, w[0].Message, "key retention 168h0m0s is shorter than topic "+long+"'s retention 720h0m0s")
		require.Empty(t, check(short, nil))
		w = check(short, &consumer.Config{KeyRetention: time.Minute, ReplayWindow: 24 * time.Hour})
		require.Len(t, w, 2)
		require.Equal(t, consumer.RetentionReplayWindow, w[0].Kind)
		require.Empty(t, w[0].Topic)
		require.Contains(t, w[0].Message, "dead-letter replay window")
		require.Equal(t, consumer.RetentionTopicLonger, w[1].Kind)
		forever := mk("-1")
		w = check(forever, nil)
		require.Len(t, w, 1)
		require.Equal(t, consumer.RetentionTopicForever, w[0].Kind)
		require.Equal(t, forever, w[0].Topic)
	})
}

// Run returns ErrClosed, and leaves nothing running, when its client is
// closed under it; and a second Run is refused.
func TestRunWithClosedClient(t *testing.T) {
	t.Parallel()
	b := newGroupBundle(t, 1)
	cl := b.client(t, b.group)
	c, err := consumer.New(b.db.Pool, cl, "svc", b.effects, fastConfig(b.db, 1))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	b.produce(t, rec("o", 1, "k"))
	eventually.True(t, 30*time.Second, func() bool { rows, _ := b.effects.count(t); return rows == 1 })
	cl.Close()
	require.ErrorIs(t, <-done, consumer.ErrClosed)
	require.ErrorIs(t, c.Run(context.Background()), consumer.ErrRunning)
}

// The runner prunes processed keys past KeyRetention in the background.
func TestRunnerPrunesExpiredKeys(t *testing.T) {
	t.Parallel()
	b := newGroupBundle(t, 1)
	cfg := fastConfig(b.db, 1)
	cfg.KeyRetention, cfg.PruneInterval = time.Millisecond, 10*time.Millisecond
	b.produce(t, stream(2, 10)...)
	r := b.start(t, b.effects, cfg)
	keys := func() int {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.db.Table("processed_keys")).Scan(&n))
		return n
	}
	eventually.True(t, 30*time.Second, func() bool { rows, _ := b.effects.count(t); return rows == 10 })
	eventually.True(t, 30*time.Second, func() bool { return keys() == 0 })
	r.stop(t)
}
