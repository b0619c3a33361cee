package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
)

// TestWriterRelayShareGroup is TestWriterRelayConsumer on a share group
// (KIP-932; Kafka 4.2 and later): the broker hands the records of every
// partition to both members, in no order, and the handler declares it
// needs none (Config.Unordered). Every event is applied exactly once,
// nothing is dead-lettered, and the group's lag reaches 0: every record,
// the second copies included, was accepted.
func TestWriterRelayShareGroup(t *testing.T) {
	t.Parallel()
	for _, run := range runs([]int{1, 10}) {
		t.Run(run.name, func(t *testing.T) {
			t.Parallel()
			const aggregates, perAggregate = 12, 15
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			db := pgtest.New(t, &pgtest.Opts{MaxConns: 40})
			b := broker(t)
			topic := topic(t, b, 4)
			published := writeAndPublishTwice(ctx, t, db, b, topic, aggregates, perAggregate)
			total := len(published)
			group := b.ShareGroup(t, nil)
			cfg := &consumer.Config{Schema: db.Schema, BatchSize: run.batch, Concurrency: run.concurrency, Unordered: true, Logger: quiet, MaxPollRecords: 20}
			stop2 := comeAndGo(ctx, t, db, b, total, effectsHandler(db), cfg, kgo.ShareGroup(group), kgo.ConsumeTopics(topic))
			adm := kadm.NewClient(b.Client(t))
			eventually.True(t, 2*time.Minute, func() bool {
				offs, err := adm.DescribeShareGroupOffsets(ctx, group)
				if err != nil || len(offs[group].Offsets[topic]) == 0 {
					return false
				}
				for _, o := range offs[group].Offsets[topic] {
					if o.Err != nil || o.Lag != 0 {
						return false
					}
				}
				return true
			}, "every record accepted")
			stop2()
			requireAppliedOnce(ctx, t, db, total)
			requireNothingSetAside(ctx, t, db)
		})
	}
}
