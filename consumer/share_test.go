package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
)

// shareClient returns a client of the share group on the bundle's topic.
func (b *groupBundle) shareClient(t *testing.T, group string) *kgo.Client {
	t.Helper()
	return b.broker.Client(t, kgo.ShareGroup(group), kgo.ConsumeTopics(b.topic), kgo.FetchMaxWait(50*time.Millisecond))
}

// startShared runs a Consumer on the share group in the background.
func (b *groupBundle) startShared(t *testing.T, group string, h consumer.Handler, cfg *consumer.Config) *running {
	t.Helper()
	cl := b.shareClient(t, group)
	c, err := consumer.New(b.db.Pool, cl, "svc", h, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cl: cl, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// shareLag returns the share group's lag over the topic's partitions: how
// many records are not yet accepted, rejected or archived; -1 until every
// partition reports one.
func (b *groupBundle) shareLag(t *testing.T, group string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := b.admin(t).DescribeShareGroupOffsets(ctx, group)
	if err != nil {
		return -1
	}
	parts := offs[group].Offsets[b.topic]
	if len(parts) == 0 {
		return -1
	}
	var sum int64
	for _, o := range parts {
		if o.Err != nil || o.Lag < 0 {
			return -1
		}
		sum += o.Lag
	}
	return sum
}

// deadLetters returns the errors of the open dead letters, by key.
func deadLetters(t *testing.T, b *groupBundle) map[string]string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT idempotency_key, error FROM `+b.db.Table("dead_letters")+` WHERE status = 'dead'`)
	require.NoError(t, err)
	out := map[string]string{}
	for rows.Next() {
		var k, e string
		require.NoError(t, rows.Scan(&k, &e))
		out[k] = e
	}
	require.NoError(t, rows.Err())
	return out
}

func TestShareGroupRefusesAnOrderedHandler(t *testing.T) {
	t.Parallel()
	b := newGroupBundle(t, 1)
	group := b.broker.ShareGroup(t, nil)
	h := b.effects
	for _, cfg := range []*consumer.Config{nil, fastConfig(b.db, 1)} {
		_, err := consumer.New(b.db.Pool, b.shareClient(t, group), "svc", h, cfg)
		require.ErrorContains(t, err, "set Config.Unordered")
	}
	cfg := fastConfig(b.db, 1)
	cfg.Unordered = true
	_, err := consumer.New(b.db.Pool, b.shareClient(t, group), "svc", h, cfg)
	require.NoError(t, err)
}

// Two members of a share group, each taking records of both partitions:
// every record is applied once, producer duplicates are skipped, a
// poison record is dead-lettered and rejected, and every record is
// acknowledged for good (the group's start offsets reach the end).
func TestShareGroupAppliesEachRecordOnce(t *testing.T) {
	t.Parallel()
	for _, md := range []struct {
		name               string
		batch, concurrency int
	}{{"SingleC1", 1, 1}, {"SingleC8", 1, 8}, {"BatchC4", 10, 4}} {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			b := newGroupBundle(t, 2)
			group := b.broker.ShareGroup(t, nil)
			recs := stream(20, 200)
			recs = append(recs, rec("agg-10", 1, "agg-10-1"), rec("agg-10", 8, "agg-10-8")) // a producer's duplicates of recs[10] and recs[150]
			recs = append(recs, rec("poison", 1, "poison-1"))
			b.effects.setFail("poison", errBroken)
			b.produceTo(t, 0, recs[:110]...)
			b.produceTo(t, 1, recs[110:]...)
			cfg := fastConfig(b.db, md.batch)
			cfg.Unordered, cfg.Concurrency = true, md.concurrency
			b.startShared(t, group, b.effects, cfg)
			b.startShared(t, group, b.effects, cfg)
			eventually.True(t, 30*time.Second, func() bool { return b.shareLag(t, group) == 0 }, "every record acknowledged")
			rows, distinct := b.effects.count(t)
			require.Equal(t, 200, rows)
			require.Equal(t, 200, distinct)
			letters := deadLetters(t, b)
			require.Len(t, letters, 1)
			require.Contains(t, letters["poison-1"], errBroken.Error())
		})
	}
}

// heldHandler is b.effects, except that for the aggregate "held" it
// blocks until its ctx ends while hold is set, and records each
// delivery's count.
type heldHandler struct {
	*effects
	mu         sync.Mutex
	hold       bool
	deliveries []int32
	entered    chan struct{}
}

func (h *heldHandler) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if m.AggregateID == "held" {
		h.mu.Lock()
		h.deliveries = append(h.deliveries, m.Record.DeliveryCount())
		hold := h.hold
		h.mu.Unlock()
		if hold {
			h.entered <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}
	}
	return h.effects.Handle(ctx, tx, m)
}

func (h *heldHandler) set(hold bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hold = hold
}

func (h *heldHandler) seen() []int32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int32(nil), h.deliveries...)
}

// A member that stops with a record unfinished releases it when the
// record has deliveries left: another member applies it, on its second
// delivery, once.
func TestShareGroupReleasesWhatItDidNotFinish(t *testing.T) {
	t.Parallel()
	b := newGroupBundle(t, 1)
	group := b.broker.ShareGroup(t, map[string]string{"share.delivery.count.limit": "5"})
	h := &heldHandler{effects: b.effects, hold: true, entered: make(chan struct{}, 10)}
	recs := append(stream(2, 10), rec("held", 1, "held-1"))
	b.produce(t, recs...)
	cfg := fastConfig(b.db, 1)
	cfg.Unordered, cfg.ShutdownGrace = true, 50*time.Millisecond
	first := b.startShared(t, group, h, cfg)
	<-h.entered
	first.stop(t)
	require.Empty(t, deadLetters(t, b), "released, not dead-lettered")
	h.set(false)
	b.startShared(t, group, h, cfg)
	eventually.True(t, 30*time.Second, func() bool { return b.shareLag(t, group) == 0 }, "every record acknowledged")
	require.Equal(t, []int64{1}, b.effects.seqs(t, "held"))
	require.Equal(t, []int32{1, 2}, h.seen())
	rows, distinct := b.effects.count(t)
	require.Equal(t, len(recs), rows)
	require.Equal(t, rows, distinct)
}

// A record a member cannot finish on its last delivery would be archived
// by the broker; the member dead-letters it instead, and a replay applies
// it.
func TestShareGroupDeadLettersWhatItCannotFinishOnItsLastDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newGroupBundle(t, 1)
	group := b.broker.ShareGroup(t, map[string]string{"share.delivery.count.limit": "2"})
	h := &heldHandler{effects: b.effects, hold: true, entered: make(chan struct{}, 10)}
	b.produce(t, rec("held", 1, "held-1"))
	cfg := fastConfig(b.db, 1)
	cfg.Unordered, cfg.ShutdownGrace = true, 50*time.Millisecond
	for delivery := 1; delivery <= 2; delivery++ {
		r := b.startShared(t, group, h, cfg)
		<-h.entered
		r.stop(t)
	}
	require.Equal(t, []int32{1, 2}, h.seen())
	letters := deadLetters(t, b)
	require.Contains(t, letters["held-1"], "not done on the share group's last delivery (delivery 2 of 2)")
	eventually.True(t, 30*time.Second, func() bool { return b.shareLag(t, group) == 0 }, "the record rejected")

	h.set(false)
	p, err := consumer.Handle(b.db.Pool, "svc", h, cfg)
	require.NoError(t, err)
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT id FROM `+b.db.Table("dead_letters")+` WHERE idempotency_key = 'held-1'`).Scan(&id))
	res, err := p.Replay(ctx, id)
	require.NoError(t, err)
	require.Equal(t, consumer.Applied, res.Outcome, fmt.Sprint(res))
	require.Equal(t, []int64{1}, b.effects.seqs(t, "held"))
}

// With Config.Unordered, sequences are information only: records applied
// in the order they come (seq 3 before 1), a duplicate skipped by its key,
// a dead letter holding nothing back, nothing parked; in single and batch
// mode.
func TestUnorderedSkipsSequenceChecks(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, nil)
			e := newEffects(t, db)
			e.failKey("a-4", errBroken)
			cfg := fastConfig(db, batch)
			cfg.Unordered = true
			p, err := consumer.Handle(db.Pool, "svc", e, cfg)
			require.NoError(t, err)
			res := processAll(t, p, batch, rec("a", 3, "a-3"), rec("a", 1, "a-1"), rec("a", 1, "a-1"), rec("a", 4, "a-4"), rec("a", 5, "a-5"), rec("a", 2, "a-2"))
			require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.Duplicate, consumer.DeadLettered, consumer.Applied, consumer.Applied}, outcomes(res))
			require.Equal(t, []int64{3, 1, 5, 2}, e.seqs(t, "a"))
			var parked int
			require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+db.Table("parked")).Scan(&parked))
			require.Zero(t, parked)
		})
	}
}
