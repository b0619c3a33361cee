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
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/internal/kafkatest"
)

// requireRealEnv names the variable that makes a missing KAFKA_BROKERS an
// error: CI sets it on the run against the real broker, so that run cannot
// fall back to kfake unnoticed.
const requireRealEnv = "INTEGRATION_REQUIRE_KAFKA"

// broker returns the cluster of this test: the real brokers in KAFKA_BROKERS
// when set, otherwise an in-process kfake cluster built with opts. It never
// skips.
func broker(t *testing.T, opts ...kfake.Opt) *kafkatest.Broker {
	t.Helper()
	if os.Getenv(requireRealEnv) != "" && os.Getenv("KAFKA_BROKERS") == "" {
		t.Fatalf("%s is set but KAFKA_BROKERS is empty; start a broker with integration/kafka/broker.sh start", requireRealEnv)
	}
	b := kafkatest.New(t, opts...)
	if b.Fake != nil {
		t.Logf("Kafka: in-process kfake at %v", b.Addrs)
	} else {
		t.Logf("Kafka: real brokers at %v (KAFKA_BROKERS)", b.Addrs)
	}
	return b
}

// The records of a round: keys aggregates, n records each, valued
// round*1000+i so that order per key and round membership can be read back.
const keys = 10

// TestBroker proves that the broker the suite runs against does what the
// suite relies on: explicit topic creation, keyed produce with per-key
// order, consumer groups, and committed offsets that a later member of the
// group resumes from.
func TestBroker(t *testing.T) {
	t.Parallel()
	const perKey = 5
	b := broker(t)
	topic := b.Topic(t, 3)
	group := "group-" + topic
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	produceRound(ctx, t, b, topic, 0, perKey)
	consumeRound(ctx, t, b, topic, group, 0, keys*perKey)
	requireCommittedAtEnd(ctx, t, b, topic, group, keys*perKey)

	// A new member of the same group resumes at the committed offsets: it
	// sees the second round only.
	produceRound(ctx, t, b, topic, 1, 2)
	consumeRound(ctx, t, b, topic, group, 1, keys*2)
	requireCommittedAtEnd(ctx, t, b, topic, group, keys*(perKey+2))
}

// TestBrokerRestart proves that records and committed group offsets survive
// a restart of the broker on its data, and that producing and consuming
// work afterwards: what broker-restart scenarios rely on.
func TestBrokerRestart(t *testing.T) {
	b := restartableBroker(t)
	if b.Fake != nil {
		t.Parallel() // a private kfake; a real broker is shared, see restartableBroker
	}
	const perKey = 4
	topic := b.Topic(t, 3)
	group := "group-" + topic
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	produceRound(ctx, t, b.Broker, topic, 0, perKey)
	consumeRound(ctx, t, b.Broker, topic, group, 0, keys*perKey)
	requireCommittedAtEnd(ctx, t, b.Broker, topic, group, keys*perKey)

	b.restart(t)

	require.Len(t, b.Records(t, topic, keys*perKey, time.Minute), keys*perKey,
		"records after the restart")
	requireCommittedAtEnd(ctx, t, b.Broker, topic, group, keys*perKey)
	produceRound(ctx, t, b.Broker, topic, 1, 1)
	consumeRound(ctx, t, b.Broker, topic, group, 1, keys)
	requireCommittedAtEnd(ctx, t, b.Broker, topic, group, keys*(perKey+1))
}

// produceRound produces n records for each of the keys aggregates.
func produceRound(ctx context.Context, t *testing.T, b *kafkatest.Broker, topic string, round, n int) {
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
	cl.Close()
}

// consumeRound reads want records as a new member of group, checks that they
// all belong to round, that every key stays on one partition with its values
// increasing, commits, and leaves the group.
func consumeRound(ctx context.Context, t *testing.T, b *kafkatest.Broker, topic, group string, round, want int) {
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
		require.Equal(t, round, v/1000, "record %s=%d of another round: redelivered after its commit?", k, v)
		if prev, ok := last[k]; ok {
			require.Greater(t, v, prev, "key %s out of order", k)
		}
		last[k] = v
	}
	require.Len(t, partitionOf, keys)
	require.NoError(t, cl.CommitUncommittedOffsets(ctx))
}

// requireCommittedAtEnd checks that group committed every partition of topic
// at its end offset, and that the end offsets add up to total.
func requireCommittedAtEnd(ctx context.Context, t *testing.T, b *kafkatest.Broker, topic, group string, total int64) {
	t.Helper()
	cl := b.Client(t)
	defer cl.Close()
	adm := kadm.NewClient(cl)
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
