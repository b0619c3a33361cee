// Package kafkatest gives tests a Kafka broker: an in-process kfake cluster
// per test, or the real brokers in KAFKA_BROKERS, and a fresh topic per use.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Broker is the Kafka cluster a test talks to.
type Broker struct {
	// Addrs are the seed brokers.
	Addrs []string
	// Fake is the in-process cluster, for fault injection; nil when the
	// test runs against KAFKA_BROKERS.
	Fake *kfake.Cluster
}

// New returns KAFKA_BROKERS when set, otherwise a kfake cluster of three
// brokers (so that leaders can move) closed when the test ends. opts apply
// only to kfake.
func New(t testing.TB, opts ...kfake.Opt) *Broker {
	t.Helper()
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		return &Broker{Addrs: strings.Split(env, ",")}
	}
	return NewFake(t, opts...)
}

// GroupConfigs are the consumer group settings of the real broker the
// integration suite runs (integration/kafka/server.properties), which
// docs/deployment.md recommends: on the consumer protocol (KIP-848), a
// member is fenced after 5 s without a heartbeat and heartbeats every
// second. NewFake gives them to kfake, whose defaults are Kafka's (45 s
// and 5 s).
var GroupConfigs = map[string]string{
	"group.consumer.session.timeout.ms":    "5000",
	"group.consumer.heartbeat.interval.ms": "1000",
}

// NewFake returns an in-process kfake cluster of three brokers whatever
// KAFKA_BROKERS says, for tests that inject faults only kfake can. The
// cluster has GroupConfigs unless opts say otherwise.
func NewFake(t testing.TB, opts ...kfake.Opt) *Broker {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(3), kfake.BrokerConfigs(GroupConfigs)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return &Broker{Addrs: c.ListenAddrs(), Fake: c}
}

// Client returns a client of the broker, closed when the test ends.
func (b *Broker) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.Addrs...)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// Topic creates a topic with a unique name and the given partition count.
func (b *Broker) Topic(t testing.TB, partitions int32) string {
	t.Helper()
	name := "test-" + randomHex(6)
	adm := kadm.NewClient(b.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, nil, name)
	require.NoError(t, err)
	require.NoError(t, resp.Err)
	return name
}

// ShareGroup names a new share group and sets its group configs: cfg on
// top of share.auto.offset.reset=earliest, so that the group reads what
// the test produced before it joined, and share.delivery.count.limit=5,
// the broker's default, which kfake does not report unless it is set.
func (b *Broker) ShareGroup(t testing.TB, cfg map[string]string) string {
	t.Helper()
	name := "share-" + randomHex(6)
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, name
	set := map[string]string{"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "5"}
	maps.Copy(set, cfg)
	for k, v := range set {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Op, c.Value = k, kmsg.IncrementalAlterConfigOpSet, &v
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, b.Client(t))
	require.NoError(t, err)
	for _, r := range resp.Resources {
		require.NoError(t, kerr.ErrorForCode(r.ErrorCode), "set the configs of share group %s", name)
	}
	return name
}

// Records reads the topic from the start until want records arrived or the
// deadline passed, and returns what it read.
func (b *Broker) Records(t testing.TB, topic string, want int, within time.Duration) []*kgo.Record {
	t.Helper()
	cl := b.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var got []*kgo.Record
	for len(got) < want {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		fetches.EachError(func(_ string, _ int32, err error) { t.Logf("kafkatest: fetch: %v", err) })
		got = append(got, fetches.Records()...)
	}
	return got
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
