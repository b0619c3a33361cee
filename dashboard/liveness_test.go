package dashboard_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// TestLiveness: the overview says which consumer processes run, how much
// each consumer applied per minute, and its lag per partition from the
// broker; a stopped consumer shows no live member.
func TestLiveness(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, &pgtest.Opts{MaxConns: 20})
	broker := kafkatest.New(t)
	topic := broker.Topic(t, 2)
	var recs []*kgo.Record
	for i := range 20 {
		agg := fmt.Sprintf("o-%d", i%4)
		recs = append(recs, producer.Record(topic, producer.Event{AggregateType: "order", AggregateID: agg, EventType: "order.changed", Payload: []byte("{}")},
			producer.Stamp{EventID: fmt.Sprintf("e-%d", i), Seq: int64(i/4 + 1)}))
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, broker.Client(t).ProduceSync(pctx, recs...).FirstErr())

	group := "g-" + topic
	cl := broker.Client(t, append([]kgo.Opt{kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond)}, consumer.ClientOpts()...)...)
	c, err := consumer.New(db.Pool, cl, "billing", consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		&consumer.Config{Schema: db.Schema, CommitInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()

	d, err := dashboard.New(db.Pool, &dashboard.Config{Schema: db.Schema, HealthEvery: -1, Kafka: broker.Client(t)})
	require.NoError(t, err)
	var page string
	eventually.True(t, 30*time.Second, func() bool {
		page = get(d, "localhost", "127.0.0.1:1", "/").Body.String()
		return containsAll(page, `<td>billing</td>`, "20 applied in the last hour", "Lag <b>0</b> records", ">live<")
	}, "a live member, 20 applied, lag 0")
	require.Contains(t, page, `<td class="">1</td>`, "one live member")
	require.Contains(t, page, group)

	stop()
	require.NoError(t, <-done)
	page = get(d, "localhost", "127.0.0.1:1", "/").Body.String()
	require.Contains(t, page, "none: requests wait", "no live member once it stopped")
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
