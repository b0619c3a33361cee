package producer_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/producer"
)

// lockedBuffer is a log sink the test reads while the relay writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the logged lines that contain msg.
func (b *lockedBuffer) lines(msg string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		if strings.Contains(l, msg) {
			out = append(out, l)
		}
	}
	return out
}

// A relay whose events go to a topic that does not exist (and the broker
// and client do not create topics) names the topic and the cause in every
// publish failure it logs, not just the first, in the line that says the
// broker has not answered yet, and in its health and the schema's; once the topic is created the events go out and the failure
// leaves the health.
func TestRelayMissingTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBundleOn(t, kafkatest.NewFake(t), 1, nil)
	missing := b.topic + "-missing"
	ev := b.event("a")
	ev.Topic = missing
	b.write(t, ev)

	var logs lockedBuffer
	relay, err := producer.NewRelay(b.db.Pool, b.broker.Client(t), &producer.RelayConfig{
		Schema: b.db.Schema, PublishTimeout: 300 * time.Millisecond, Lease: 600 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	cause := `topic "` + missing + `" does not exist (UNKNOWN_TOPIC_OR_PARTITION); create it, or enable auto-creation`
	waitFor(t, 60*time.Second, "three publish failures logged", func() bool { return len(logs.lines("relay: publish failed")) >= 3 })
	for _, l := range logs.lines("relay: publish failed") {
		require.Contains(t, l, "topic="+missing)
		require.Contains(t, l, strings.ReplaceAll(cause, `"`, `\"`), "every failure names the cause")
	}

	// The lease is renewed every 200ms while a publish waits its 300ms,
	// and the line that says so names what it waits on.
	waitFor(t, 60*time.Second, "a wait logged with the known failure", func() bool {
		return len(logs.lines(`last_failure="topic \"`+missing+`\" does not exist`)) > 0
	})
	for _, l := range logs.lines("relay: the broker has not answered") {
		require.Contains(t, l, "waiting_on.topics="+missing)
	}

	failing := relay.Health().FailingTopics
	require.Len(t, failing, 1)
	require.Equal(t, missing, failing[0].Topic)
	require.Contains(t, failing[0].Error, cause)
	require.GreaterOrEqual(t, failing[0].Failures, 3)
	h, err := inspector(t, b.db).Health(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, h.Undelivered)
	require.Contains(t, h.OldestUndeliveredError, cause)

	resp, err := kadm.NewClient(b.broker.Client(t)).CreateTopic(ctx, 1, 1, nil, missing)
	require.NoError(t, err)
	require.NoError(t, resp.Err)
	b.waitDelivered(t, 60*time.Second)
	waitFor(t, 10*time.Second, "the topic gone from the relay's health", func() bool { return len(relay.Health().FailingTopics) == 0 })
}
