package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/ordering"
)

// produceTo produces recs to partition p of the bundle's topic.
func (b *groupBundle) produceTo(t *testing.T, p int32, recs ...*kgo.Record) {
	t.Helper()
	cl := b.broker.Client(t, kgo.DefaultProduceTopic(b.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for _, r := range recs {
		r.Partition = p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
}

// committedAt returns the group's committed offset of partition p, -1 when
// none.
func (b *groupBundle) committedAt(t *testing.T, p int32) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	at := int64(-1)
	offs, err := b.admin(t).FetchOffsets(ctx, b.group)
	if err != nil {
		return at
	}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Partition == p {
			at = o.At
		}
	})
	return at
}

// A partition whose handler is stuck, with its lane full, holds up no other
// partition: the other's records are all applied and committed meanwhile,
// in every mode.
func TestStuckPartitionDoesNotDelayOthers(t *testing.T) {
	t.Parallel()
	for _, md := range runnerModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			b := newGroupBundle(t, 2)
			release := make(chan struct{})
			h := handlerOf(md, b.effects, func(m *consumer.Message) {
				if m.Partition == 0 {
					<-release
				}
			})
			var stuck, free []*kgo.Record
			for seq := int64(1); seq <= 10; seq++ {
				for a := range 3 {
					stuck = append(stuck, rec(fmt.Sprintf("stuck-%d", a), seq, fmt.Sprintf("stuck-%d-%d", a, seq)))
					free = append(free, rec(fmt.Sprintf("free-%d", a), seq, fmt.Sprintf("free-%d-%d", a, seq)))
				}
			}
			b.produceTo(t, 0, stuck...)
			b.produceTo(t, 1, free...)
			cfg := md.config(b.db)
			cfg.PartitionBuffer = 4 // the stuck lane fills and pauses its partition
			cfg.CommitInterval = 20 * time.Millisecond
			r := b.start(t, h, cfg)
			eventually.True(t, 30*time.Second, func() bool { return b.committedAt(t, 1) == int64(len(free)) }, "the free partition applied and committed")
			rows, _ := b.effects.count(t)
			require.Equal(t, len(free), rows, "nothing of the stuck partition applied yet")
			close(release)
			eventually.True(t, 30*time.Second, func() bool { return b.committedAt(t, 0) == int64(len(stuck)) }, "the stuck partition applied and committed")
			r.stop(t)
			rows, distinct := b.effects.count(t)
			require.Equal(t, len(stuck)+len(free), rows)
			require.Equal(t, rows, distinct)
			for a := range 3 {
				for _, agg := range []string{"stuck", "free"} {
					require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, b.effects.seqs(t, fmt.Sprintf("%s-%d", agg, a)))
				}
			}
		})
	}
}

// handlerOf returns md's handler over e, calling before first for each
// message (for a BatchHandler, for each message of the batch).
func handlerOf(md mode, e *effects, before func(*consumer.Message)) consumer.Handler {
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		before(m)
		return e.Handle(ctx, tx, m)
	})
	if !md.batchHandler {
		return h
	}
	return beforeBatch{h, batchEffects{e}, before}
}

type beforeBatch struct {
	consumer.HandlerFunc
	next   batchEffects
	before func(*consumer.Message)
}

func (b beforeBatch) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	for _, m := range ms {
		b.before(m)
	}
	return b.next.HandleBatch(ctx, tx, ms)
}

// Above Concurrency 1, a record that is not done (here under GapFail, its
// aggregate's sequence 1 missing) is retried while it holds back only its
// own aggregate: the partition's other aggregates are applied, and the
// committed offset stays at the retried record, the lowest one not done.
// When the gap fills, the record and its successor are applied and the
// offset moves to the end.
func TestRetriedRecordHoldsOnlyItsAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, md := range runnerModes {
		if md.concurrency == 1 {
			continue
		}
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			b := newGroupBundle(t, 1)
			recs := stream(3, 6) // offsets 0-5
			recs = append(recs, rec("held", 2, "held-2"), rec("held", 3, "held-3"))
			recs = append(recs, stream(3, 30)[6:]...)
			b.produce(t, recs...)
			cfg := md.config(b.db)
			cfg.GapPolicy = ordering.GapFail
			cfg.CommitInterval = 20 * time.Millisecond
			r := b.start(t, md.handler(b.effects), cfg)
			eventually.True(t, 30*time.Second, func() bool { rows, _ := b.effects.count(t); return rows == 30 }, "the other aggregates applied")
			require.Empty(t, b.effects.seqs(t, "held"), "the held aggregate waits for its gap")
			r.stop(t) // commits on the way out
			require.EqualValues(t, 6, b.committedAt(t, 0), "committed up to the retried record, not past it")

			// The gap fills from elsewhere (a record of seq 1 applied by
			// another path); the runner, started again, applies the rest.
			p, err := consumer.Handle(b.db.Pool, "svc", md.handler(b.effects), cfg)
			require.NoError(t, err)
			one := rec("held", 1, "held-1")
			one.Topic, one.Offset = "elsewhere", 1
			res, err := p.Process(ctx, one)
			require.NoError(t, err)
			require.Equal(t, consumer.Applied, res.Outcome)
			b.start(t, md.handler(b.effects), cfg)
			eventually.True(t, 30*time.Second, func() bool { return b.committedAt(t, 0) == int64(len(recs)) }, "everything committed")
			require.Equal(t, []int64{1, 2, 3}, b.effects.seqs(t, "held"))
			rows, distinct := b.effects.count(t)
			require.Equal(t, 33, rows)
			require.Equal(t, 33, distinct)
		})
	}
}

// When the group fences this member (its heartbeat answered
// UNKNOWN_MEMBER_ID, as when its session expired; the group runs the
// consumer protocol, KIP-848, which ClientOpts asks for), its partitions are
// lost: the record in flight is abandoned at once, its handler's context
// cancelled without waiting for ShutdownGrace (an hour here). The member
// rejoins, gets the partition back and applies the record once.
func TestLostPartitionsAbandonWorkAtOnce(t *testing.T) {
	t.Parallel()
	b := newGroupBundleOn(t, kafkatest.NewFake(t), 1) // fencing needs kfake's request control
	var (
		entered   = make(chan struct{})
		cancelled = make(chan struct{})
		once      sync.Once
		held      atomic.Bool
	)
	held.Store(true)
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.AggregateID == "held" && held.Load() {
			once.Do(func() { close(entered) })
			<-ctx.Done()
			held.Store(false)
			close(cancelled)
			return ctx.Err()
		}
		return b.effects.Handle(ctx, tx, m)
	})
	recs := append(stream(2, 4), rec("held", 1, "held-1"))
	b.produce(t, recs...)
	cfg := fastConfig(b.db, 1)
	cfg.ShutdownGrace, cfg.HandlerTimeout, cfg.CommitInterval = time.Hour, -1, 20*time.Millisecond
	r := b.start(t, h, cfg)
	<-entered
	eventually.True(t, 30*time.Second, func() bool { return b.committedAt(t, 0) == 4 }, "the records before the held one committed")

	var fenced atomic.Bool
	b.broker.Fake.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if !fenced.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		resp := req.(*kmsg.ConsumerGroupHeartbeatRequest).ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil, true
	})
	select {
	case <-cancelled:
	case <-time.After(30 * time.Second):
		t.Fatal("the lost partition's handler was not cancelled")
	}
	eventually.True(t, 30*time.Second, func() bool { return b.committedAt(t, 0) == int64(len(recs)) }, "the held record applied after the rejoin")
	r.stop(t)
	require.Equal(t, []int64{1}, b.effects.seqs(t, "held"))
	rows, distinct := b.effects.count(t)
	require.Equal(t, len(recs), rows)
	require.Equal(t, len(recs), distinct)
}

// A partition that leaves this member and comes back while the member's
// poll waits (no records anywhere) is consumed from its committed offset
// when records arrive: the records of the poll that spanned the move are
// the new assignment's, not stale ones to drop.
func TestPartitionBackDuringAPollIsConsumed(t *testing.T) {
	t.Parallel()
	for _, md := range runnerModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			b := newGroupBundle(t, 2)
			h := md.handler(b.effects)
			cfg := md.config(b.db)
			cfg.CommitInterval = 20 * time.Millisecond
			a := b.start(t, h, cfg)
			eventually.True(t, 30*time.Second, b.stableWith(t, 1), "the first member owns both partitions")
			other := b.start(t, h, cfg)
			eventually.True(t, 30*time.Second, b.stableWith(t, 2), "a partition moved to the second member")
			other.stop(t)
			eventually.True(t, 30*time.Second, b.stableWith(t, 1), "the partition came back to the first member")

			recs := stream(4, 40)
			b.produceTo(t, 0, recs[:20]...)
			b.produceTo(t, 1, recs[20:]...)
			eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == int64(len(recs)) }, "both partitions applied and committed")
			a.stop(t)
			rows, distinct := b.effects.count(t)
			require.Equal(t, len(recs), rows)
			require.Equal(t, rows, distinct)
		})
	}
}
