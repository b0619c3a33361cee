package producer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// bundle is one relay test's world: a schema, a broker, a topic.
type bundle struct {
	db     *pgtest.DB
	broker *kafkatest.Broker
	topic  string
	writer *producer.Writer
	// appName tags the relays' connections so a test can terminate them
	// without touching other tests' sessions on the shared server.
	appName string
}

func newBundle(t *testing.T, partitions int32) *bundle {
	t.Helper()
	return newBundleOn(t, kafkatest.New(t), partitions, nil)
}

// newFaultBundle is newBundle on kfake, for tests that inject broker faults.
func newFaultBundle(t *testing.T, partitions int32) *bundle {
	t.Helper()
	return newBundleOn(t, kafkatest.NewFake(t), partitions, nil)
}

func newBundleOn(t *testing.T, broker *kafkatest.Broker, partitions int32, opts *pgtest.Opts) *bundle {
	t.Helper()
	db := pgtest.New(t, opts)
	return &bundle{
		db:      db,
		broker:  broker,
		topic:   broker.Topic(t, partitions),
		writer:  producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}),
		appName: "relay_" + db.Schema,
	}
}

func (b *bundle) event(agg string) producer.Event {
	return producer.Event{AggregateType: "account", AggregateID: agg, EventType: "funds.moved", Payload: []byte("p-" + agg), Topic: b.topic}
}

// write commits events in one transaction.
func (b *bundle) write(t testing.TB, events ...producer.Event) []producer.Written {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	written, err := b.writer.Write(ctx, tx, events...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return written
}

// startRelay runs a relay until the returned stop is called (or the test
// ends) and checks that Run returned as it should.
func (b *bundle) startRelay(t *testing.T, cfg *producer.RelayConfig, opts ...kgo.Opt) (stop func()) {
	t.Helper()
	_, stop = b.startRelayAnd(t, cfg, opts...)
	return stop
}

// startRelayWith is startRelay for a test that needs the relay itself.
func (b *bundle) startRelayWith(t *testing.T, cfg *producer.RelayConfig, opts ...kgo.Opt) *producer.Relay {
	t.Helper()
	relay, _ := b.startRelayAnd(t, cfg, opts...)
	return relay
}

func (b *bundle) startRelayAnd(t *testing.T, cfg *producer.RelayConfig, opts ...kgo.Opt) (relay *producer.Relay, stop func()) {
	t.Helper()
	poolCfg, err := pgxpool.ParseConfig(b.db.Server.URL)
	require.NoError(t, err)
	poolCfg.ConnConfig.RuntimeParams["application_name"] = b.appName
	poolCfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	require.NoError(t, err)
	client := b.broker.Client(t, opts...)
	c := producer.RelayConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = b.db.Schema
	c.Logger = testLogger(t)
	relay, err = producer.NewRelay(pool, client, &c)
	require.NoError(t, err)
	return relay, runInBackground(t, "relay", relay.Run, pool.Close)
}

// runInBackground runs run until the returned stop (also a cleanup of t)
// cancels it; stop then waits up to 30s for it to return nil and calls
// after.
func runInBackground(t *testing.T, what string, run func(context.Context) error, after func()) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal(what + " did not return within 30s of cancellation")
			}
			after()
		})
	}
	t.Cleanup(stop)
	return stop
}

// failUpdates makes the first n statements that update column of the
// events table fail, as if the database went away at that moment, and
// returns a function that counts the statements seen so far. A sequence
// counts them because nextval survives the rollback.
func (b *bundle) failUpdates(t *testing.T, column string, n int) (seen func() int64) {
	t.Helper()
	ctx := context.Background()
	counter, fn := b.db.Table("updates_of_"+column), b.db.Table("fail_updates_of_"+column)
	_, err := b.db.Pool.Exec(ctx, `
CREATE SEQUENCE `+counter+`;
CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('`+counter+`') <= `+strconv.Itoa(n)+` THEN RAISE EXCEPTION 'injected failure'; END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER fail_updates AFTER UPDATE OF `+column+` ON `+b.db.Table("events")+`
    FOR EACH STATEMENT EXECUTE FUNCTION `+fn+`();`)
	require.NoError(t, err)
	return func() int64 {
		var v int64
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM `+counter).Scan(&v))
		return v
	}
}

// inspector returns the Inspector of db's schema on its pool.
func inspector(t testing.TB, db *pgtest.DB) *producer.Inspector {
	t.Helper()
	in, err := producer.NewInspector(db.Pool, db.Schema)
	require.NoError(t, err)
	return in
}

// deadEvents returns the verbs on the dead events of db's schema.
func deadEvents(t testing.TB, db *pgtest.DB) *producer.DeadEvents {
	t.Helper()
	d, err := producer.NewDeadEvents(&producer.DeadEventsConfig{Schema: db.Schema})
	require.NoError(t, err)
	return d
}

func (b *bundle) undelivered(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+b.db.Table("events")+` WHERE published_at IS NULL`).Scan(&n))
	return n
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *bundle) waitDelivered(t testing.TB, within time.Duration) {
	t.Helper()
	waitFor(t, within, "every event delivered", func() bool { return b.undelivered(t) == 0 })
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// checkOrder fails unless, for every key, the first appearances of its
// sequence numbers come in order 1, 2, 3, ... with none missing: a
// duplicate of an earlier event later on is at-least-once at work, but a
// sequence appearing before its predecessor was ever on the wire is a
// broken order. It returns the distinct event ids seen.
func checkOrder(t testing.TB, records []*kgo.Record) map[string]bool {
	t.Helper()
	next := map[string]int64{}
	ids := map[string]bool{}
	partitionOf := map[[2]string]int32{}
	for _, r := range records {
		key := string(r.Key)
		if p, ok := partitionOf[[2]string{r.Topic, key}]; ok {
			require.Equal(t, p, r.Partition, "key %s moved partitions", key)
		}
		partitionOf[[2]string{r.Topic, key}] = r.Partition
		s, ok := header(r, outbox.HeaderAggregateSeq)
		require.True(t, ok, "record without sequence header")
		seq, err := strconv.ParseInt(s, 10, 64)
		require.NoError(t, err)
		id, _ := header(r, outbox.HeaderEventID)
		ids[id] = true
		want := next[key] + 1
		switch {
		case seq == want:
			next[key] = seq
		case seq < want:
			// a redelivery of something already seen
		default:
			require.Failf(t, "order broken", "key %s: seq %d on the wire before seq %d", key, seq, want)
		}
	}
	return ids
}

func aggName(i int) string { return fmt.Sprintf("acct-%03d", i) }

// testLogger sends a component's logs to the test's log, shown only when
// the test fails or runs with -v.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
