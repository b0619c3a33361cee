package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/internal/kafkatest"
)

// requireRealEnv names the variable that makes a missing KAFKA_BROKERS an
// error: CI sets it on the run against the real broker, so that run cannot
// fall back to kfake unnoticed.
const requireRealEnv = "INTEGRATION_REQUIRE_KAFKA"

// broker returns the cluster of this test: the real brokers in KAFKA_BROKERS
// when set, otherwise an in-process kfake cluster. It never skips.
func broker(t *testing.T) *kafkatest.Broker {
	t.Helper()
	if os.Getenv(requireRealEnv) != "" && os.Getenv("KAFKA_BROKERS") == "" {
		t.Fatalf("%s is set but KAFKA_BROKERS is empty; start a broker with integration/kafka/broker.sh start", requireRealEnv)
	}
	b := kafkatest.New(t)
	if b.Fake != nil {
		t.Logf("Kafka: in-process kfake at %v", b.Addrs)
	} else {
		t.Logf("Kafka: real brokers at %v (KAFKA_BROKERS)", b.Addrs)
	}
	return b
}

// TestBroker proves that the broker the suite runs against does what the
// suite relies on: explicit topic creation, keyed produce with per-key
// order, consumer groups, and committed offsets that a later member of the
// group resumes from.
func TestBroker(t *testing.T) {
	t.Parallel()
	const (
		partitions = 3
		keys       = 10
		perKey     = 5
	)
	b := broker(t)
	topic := b.Topic(t, partitions)
	group := "group-" + topic
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	produce := func(t *testing.T, round, n int) {
		t.Helper()
		cl := b.Client(t, kgo.DefaultProduceTopic(topic))
		var recs []*kgo.Record
		for i := range n {
			for k := range keys {
				recs = append(recs, &kgo.Record{
					Key:   []byte(fmt.Sprintf("agg-%d", k)),
					Value: []byte(strconv.Itoa(round*1000 + i)),
				})
			}
		}
		require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
	}

	// consume reads want records as a member of group, checks that every key
	// stays on one partition with its values increasing, commits, and leaves.
	consume := func(t *testing.T, want int) []*kgo.Record {
		t.Helper()
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(b.Addrs...),
			kgo.ConsumerGroup(group),
			kgo.ConsumeTopics(topic),
			kgo.DisableAutoCommit(),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxWait(500*time.Millisecond),
		)
		require.NoError(t, err)
		defer cl.Close()
		var got []*kgo.Record
		for len(got) < want {
			fetches := cl.PollFetches(ctx)
			require.NoError(t, ctx.Err(), "consumed %d of %d records", len(got), want)
			fetches.EachError(func(topic string, p int32, err error) {
				require.NoError(t, err, "fetch %s/%d", topic, p)
			})
			got = append(got, fetches.Records()...)
		}
		require.Len(t, got, want, "more records than produced")

		partitionOf := map[string]int32{}
		last := map[string]int{}
		for _, r := range got {
			k := string(r.Key)
			if p, ok := partitionOf[k]; ok {
				require.Equal(t, p, r.Partition, "key %s moved partition", k)
			}
			partitionOf[k] = r.Partition
			v, err := strconv.Atoi(string(r.Value))
			require.NoError(t, err)
			if prev, ok := last[k]; ok {
				require.Greater(t, v, prev, "key %s out of order", k)
			}
			last[k] = v
		}
		require.Len(t, partitionOf, keys)
		require.NoError(t, cl.CommitUncommittedOffsets(ctx))
		return got
	}

	requireCommittedAtEnd := func(t *testing.T, total int64) {
		t.Helper()
		adm := kadm.NewClient(b.Client(t))
		ends, err := adm.ListEndOffsets(ctx, topic)
		require.NoError(t, err)
		require.NoError(t, ends.Error())
		committed, err := adm.FetchOffsets(ctx, group)
		require.NoError(t, err)
		require.NoError(t, committed.Error())
		var sum int64
		ends.Each(func(end kadm.ListedOffset) {
			c, ok := committed.Lookup(topic, end.Partition)
			require.True(t, ok, "no committed offset for partition %d", end.Partition)
			require.Equal(t, end.Offset, c.At, "partition %d", end.Partition)
			sum += end.Offset
		})
		require.Equal(t, total, sum)
	}

	produce(t, 0, perKey)
	first := consume(t, keys*perKey)
	require.Len(t, first, keys*perKey)
	requireCommittedAtEnd(t, keys*perKey)

	// A new member of the same group resumes at the committed offsets: it
	// sees the second round only.
	produce(t, 1, 2)
	second := consume(t, keys*2)
	for _, r := range second {
		v, err := strconv.Atoi(string(r.Value))
		require.NoError(t, err)
		require.GreaterOrEqual(t, v, 1000, "record of the first round redelivered after its commit")
	}
	requireCommittedAtEnd(t, keys*(perKey+2))
}
