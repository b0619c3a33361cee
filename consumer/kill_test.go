package consumer_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
)

// killChildEnv, set in the environment of this test binary, makes it run
// one Consumer at Concurrency 16 instead of the tests (see TestMain),
// configured by the variables below, until it is killed. Its handler
// writes effect rows like effects and never returns for an aggregate
// whose id ends in "held". With killChildTargets set it routes (byPrefix)
// to the targets listed there, each a schema of the database given.
const (
	killChildEnv     = "OUTBOX_TEST_CONSUMER_CHILD"
	killChildDB      = "OUTBOX_TEST_CONSUMER_DATABASE_URL"
	killChildSchema  = "OUTBOX_TEST_CONSUMER_SCHEMA"
	killChildTable   = "OUTBOX_TEST_CONSUMER_TABLE"
	killChildBrokers = "OUTBOX_TEST_CONSUMER_BROKERS"
	killChildTopic   = "OUTBOX_TEST_CONSUMER_TOPIC"
	// killChildTargets lists the targets as name=schema,name=schema; the
	// table is then unqualified, found on each target's search_path.
	killChildTargets = "OUTBOX_TEST_CONSUMER_TARGETS"
)

// killChildMain runs the Consumer of a child process.
func killChildMain() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx := context.Background()
	cfg := &consumer.Config{
		Schema: os.Getenv(killChildSchema), Concurrency: 16, CommitInterval: 20 * time.Millisecond,
		HandlerTimeout: -1, Logger: log,
	}
	var db consumer.DB
	if targets := os.Getenv(killChildTargets); targets != "" {
		cfg.Route = &consumer.Route{Owner: byPrefix}
		for _, tgt := range strings.Split(targets, ",") {
			name, schema, _ := strings.Cut(tgt, "=")
			pc, err := pgxpool.ParseConfig(os.Getenv(killChildDB))
			if err != nil {
				log.Error("child: database", slog.String("error", err.Error()))
				return 2
			}
			pc.ConnConfig.RuntimeParams["search_path"] = schema
			tp, err := pgxpool.NewWithConfig(ctx, pc)
			if err != nil {
				log.Error("child: connect", slog.String("error", err.Error()))
				return 2
			}
			cfg.Route.Targets = append(cfg.Route.Targets, consumer.Target{Name: name, DB: tp, Schema: schema})
		}
	} else {
		pool, err := pgxpool.New(ctx, os.Getenv(killChildDB))
		if err != nil {
			log.Error("child: connect", slog.String("error", err.Error()))
			return 2
		}
		db = pool
	}
	topic, table := os.Getenv(killChildTopic), os.Getenv(killChildTable)
	client, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(strings.Split(os.Getenv(killChildBrokers), ",")...),
		kgo.ConsumerGroup(os.Getenv(killChildEnv)), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond),
		// The group forgets the killed child soon, so the next member
		// need not wait 45s for its session to expire: on the consumer
		// protocol (KIP-848) the broker's session applies
		// (kafkatest.GroupConfigs, 5s); these, if it falls back to the
		// classic one.
		kgo.SessionTimeout(6 * time.Second), kgo.RebalanceTimeout(6 * time.Second),
	}, consumer.ClientOpts()...)...)
	if err != nil {
		log.Error("child: kafka client", slog.String("error", err.Error()))
		return 2
	}
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if strings.HasSuffix(m.AggregateID, "held") {
			select {} // until the process is killed
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (key, aggregate, seq) VALUES ($1, $2, $3)`, m.IdempotencyKey, m.AggregateID, m.Seq)
		return err
	})
	c, err := consumer.New(db, client, "svc", h, cfg)
	if err != nil {
		log.Error("child: new consumer", slog.String("error", err.Error()))
		return 2
	}
	if err := c.Run(ctx); err != nil {
		log.Error("child: run", slog.String("error", err.Error()))
	}
	return 1
}

// Above Concurrency 1 a partition's committed offset is its lowest record
// not done. A process whose handler hangs on one record, with the records
// after it applied, commits up to that record and no further; killed with
// SIGKILL, its hung transaction rolls back, and the next member applies
// that record and skips the ones after it as duplicates: each effect once,
// in order, with no map of done offsets anywhere.
func TestKilledMemberResumesAtLowestRecordNotDone(t *testing.T) {
	t.Parallel()
	b := newGroupBundle(t, 1)
	recs := stream(3, 10)                         // offsets 0-9
	recs = append(recs, rec("held", 1, "held-1")) // offset 10
	recs = append(recs, stream(3, 50)[10:]...)    // offsets 11-50
	b.produce(t, recs...)

	kill := startKillChild(t, b, killChildSchema+"="+b.db.Schema, killChildTable+"="+b.effects.table)
	eventually.True(t, 60*time.Second, func() bool { rows, _ := b.effects.count(t); return rows == 50 }, "the child applied every record but the held one")
	eventually.True(t, 30*time.Second, func() bool { return b.committedAt(t, 0) == 10 }, "the child committed up to the held record")
	kill()
	require.EqualValues(t, 10, b.committedAt(t, 0), "never committed past the held record")

	hooks := &counter{outcomes: map[consumer.Outcome]int{}, open: map[*kgo.Record]int{}}
	cfg := fastConfig(b.db, 1)
	cfg.Concurrency, cfg.Tracer = 16, hooks
	r := b.start(t, b.effects, cfg)
	eventually.True(t, 60*time.Second, func() bool { return b.committedAt(t, 0) == int64(len(recs)) }, "everything committed")
	r.stop(t)
	rows, distinct := b.effects.count(t)
	require.Equal(t, len(recs), rows)
	require.Equal(t, len(recs), distinct)
	require.Equal(t, []int64{1}, b.effects.seqs(t, "held"))
	for a := range 3 {
		want := make([]int64, 0, 17)
		for seq := int64(1); seq <= 17; seq++ {
			if a == 2 && seq == 17 {
				break
			}
			want = append(want, seq)
		}
		require.Equal(t, want, b.effects.seqs(t, fmt.Sprintf("agg-%d", a)))
	}
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	require.Equal(t, 1, hooks.outcomes[consumer.Applied], "the held record, applied by the next member")
	require.Equal(t, 40, hooks.outcomes[consumer.Duplicate], "the records after it, done already, skipped")
}

// startKillChild starts the child Consumer of b's group, topic, broker and
// database, with env added to its environment, and returns the function
// that kills it with SIGKILL and waits for it to exit.
func startKillChild(t *testing.T, b *groupBundle, env ...string) (kill func()) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(),
		killChildEnv+"="+b.group,
		killChildDB+"="+b.db.Server.URL,
		killChildBrokers+"="+strings.Join(b.broker.Addrs, ","),
		killChildTopic+"="+b.topic), env...)
	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return out.Write(p)
	})
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			mu.Lock()
			t.Logf("log of the child:\n%s", out.String())
			mu.Unlock()
		}
	})
	return func() {
		require.NoError(t, cmd.Process.Kill())
		<-exited
		exited <- nil // for the cleanup
	}
}

// writerFunc is an io.Writer that calls itself.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestKilledMemberResumesAtLowestRecordNotDone for a Consumer that routes
// to two targets: the held record is target b's, and the records after it,
// of both targets, are applied in their targets before the child is
// killed. The offset never passes the held record; the next member
// applies it in b and skips the rest as duplicates: each effect once, in
// its own target only, in order per aggregate.
func TestKilledRoutingMemberResumesAtLowestRecordNotDone(t *testing.T) {
	t.Parallel()
	b := newGroupBundle(t, 1)
	ts := newRouteTargets(t, "a", "b")
	for _, rt := range ts {
		require.Equal(t, b.db.Server.URL, rt.db.Server.URL, "the child reaches every target through one server")
	}
	const aggs, n = 3, 8
	all := routeStream(aggs, n)                                          // 48 records, a's and b's interleaved
	recs := append(slices.Clone(all[:10]), rec("b-held", 1, "b-held-1")) // offset 10
	recs = append(recs, all[10:]...)                                     // offsets 11-48
	b.produce(t, recs...)

	kill := startKillChild(t, b, killChildTargets+"=a="+ts[0].db.Schema+",b="+ts[1].db.Schema, killChildTable+"=effects")
	applied := func() int {
		total := 0
		for _, rt := range ts {
			rows, _ := rt.e.count(t)
			total += rows
		}
		return total
	}
	eventually.True(t, 60*time.Second, func() bool { return applied() == len(all) }, "the child applied every record but the held one, in both targets")
	eventually.True(t, 30*time.Second, func() bool { return b.committedAt(t, 0) == 10 }, "the child committed up to the held record")
	kill()
	require.EqualValues(t, 10, b.committedAt(t, 0), "never committed past the held record")

	hooks := &counter{outcomes: map[consumer.Outcome]int{}, open: map[*kgo.Record]int{}}
	cfg := routeConfig(1, ts)
	cfg.Concurrency, cfg.Tracer, cfg.CommitInterval = 16, hooks, 10*time.Millisecond
	cl := b.client(t, b.group)
	c, err := consumer.New(nil, cl, "svc", &pathEffects{}, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cl: cl, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	eventually.True(t, 60*time.Second, func() bool { return b.committedAt(t, 0) == int64(len(recs)) }, "everything committed")
	r.stop(t)

	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i + 1)
	}
	for _, rt := range ts {
		rows, distinct := rt.e.count(t)
		wantRows := aggs * n
		if rt.name == "b" {
			wantRows++ // b-held
		}
		require.Equal(t, wantRows, rows, "target %s holds its effects only", rt.name)
		require.Equal(t, rows, distinct, "target %s applied no effect twice", rt.name)
		for i := range aggs {
			require.Equal(t, want, rt.e.seqs(t, fmt.Sprintf("%s-%d", rt.name, i)), "target %s, in order", rt.name)
		}
	}
	require.Equal(t, []int64{1}, ts[1].e.seqs(t, "b-held"))
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	require.Equal(t, 1, hooks.outcomes[consumer.Applied], "the held record, applied by the next member")
	require.Equal(t, len(recs)-11, hooks.outcomes[consumer.Duplicate], "the records after it, done already, skipped")
}
