package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
)

// fetchCount is a kgo hook counting the records franz-go decodes into its
// buffer, per partition and offset: a record fetched again is counted
// again.
type fetchCount struct {
	mu       sync.Mutex
	buffered map[int32]map[int64]int
}

func (f *fetchCount) OnFetchRecordBuffered(r *kgo.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.buffered[r.Partition] == nil {
		f.buffered[r.Partition] = map[int64]int{}
	}
	f.buffered[r.Partition][r.Offset]++
}

// totals returns how many records were buffered in all, and how many
// distinct ones.
func (f *fetchCount) totals() (all, distinct int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, offs := range f.buffered {
		distinct += len(offs)
		for _, n := range offs {
			all += n
		}
	}
	return all, distinct
}

// A lane that reaches PartitionBuffer pauses its partition without making
// franz-go fetch and decode again what it had buffered of it: draining a
// backlog many times PartitionBuffer, in several fetches per partition,
// every record is decoded about once. Pausing at once (before the pause
// waited for the rest of the fetch) dropped the rest of each fetch of the
// partition at the next poll and refetched it after the resume: 12.6
// decodes per record here. The margin allows for the fetch franz-go may
// build at once when a poll takes the last records of a broker's buffered
// fetch, before the pauses that poll leads to are applied: of a partition
// paused then, that fetch's records are dropped and fetched again.
func TestRunnerDecodesEachRecordAboutOnce(t *testing.T) {
	t.Parallel()
	const partitions, perPartition = 4, 2500
	b := newGroupBundle(t, partitions)
	// Small batches and fetches: a partition's backlog takes several
	// fetches, each of several batches.
	prod := b.broker.Client(t, kgo.DefaultProduceTopic(b.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(8<<10))
	var recs []*kgo.Record
	for p := range int32(partitions) {
		for i := range perPartition {
			agg := fmt.Sprintf("p%d-a%d", p, i%20)
			r := rec(agg, int64(i/20+1), fmt.Sprintf("%s-%d", agg, i/20+1))
			r.Partition = p
			recs = append(recs, r)
		}
	}
	pctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	require.NoError(t, prod.ProduceSync(pctx, recs...).FirstErr())
	count := &fetchCount{buffered: map[int32]map[int64]int{}}
	cl := b.broker.Client(t, append([]kgo.Opt{
		kgo.ConsumerGroup(b.group), kgo.ConsumeTopics(b.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond),
		kgo.WithHooks(count), kgo.FetchMaxPartitionBytes(64 << 10),
	}, consumer.ClientOpts()...)...)
	cfg := fastConfig(b.db, 50)
	cfg.PartitionBuffer, cfg.MaxPollRecords = 100, 100
	c, err := consumer.New(b.db.Pool, cl, "svc", batchEffects{b.effects}, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	eventually.True(t, 2*time.Minute, func() bool {
		rows, _ := b.effects.count(t)
		return rows >= partitions*perPartition
	}, "every record applied")
	cancel()
	require.NoError(t, <-done)
	cl.Close()
	rows, distinct := b.effects.count(t)
	require.Equal(t, partitions*perPartition, rows)
	require.Equal(t, rows, distinct, "a record applied twice")
	all, decoded := count.totals()
	require.Equal(t, partitions*perPartition, decoded, "records never fetched")
	t.Logf("franz-go buffered %d records for %d (%.2fx)", all, decoded, float64(all)/float64(decoded))
	require.LessOrEqual(t, float64(all), 1.2*float64(decoded), "records fetched and decoded again after a pause")
}
