package integration

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox/producer"
)

// relayProcessEnv, set in the environment of this test binary, makes it
// run one relay with the default RelayConfig instead of the tests (see
// TestMain), configured by the variables below, until SIGTERM.
const (
	relayProcessEnv     = "OUTBOX_TEST_RELAY_PROCESS"
	relayProcessDB      = "OUTBOX_TEST_RELAY_DATABASE_URL"
	relayProcessSchema  = "OUTBOX_TEST_RELAY_SCHEMA"
	relayProcessBrokers = "OUTBOX_TEST_RELAY_BROKERS"
)

// relayProcessMain runs the relay of a relay process; relayProcessEnv is
// its name, which is also its application_name.
func relayProcessMain() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	name := os.Getenv(relayProcessEnv)
	poolCfg, err := pgxpool.ParseConfig(os.Getenv(relayProcessDB))
	if err != nil {
		log.Error("relay process: parse database URL", slog.String("error", err.Error()))
		return 2
	}
	poolCfg.ConnConfig.RuntimeParams["application_name"] = name
	poolCfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		log.Error("relay process: connect", slog.String("error", err.Error()))
		return 2
	}
	defer pool.Close()
	client, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(os.Getenv(relayProcessBrokers), ",")...))
	if err != nil {
		log.Error("relay process: kafka client", slog.String("error", err.Error()))
		return 2
	}
	defer client.Close()
	relay, err := producer.NewRelay(pool, client, &producer.RelayConfig{Schema: os.Getenv(relayProcessSchema), RelayID: name, Logger: log})
	if err != nil {
		log.Error("relay process: new relay", slog.String("error", err.Error()))
		return 2
	}
	if err := relay.Run(ctx); err != nil {
		log.Error("relay process: run", slog.Any("error", err))
		return 1
	}
	return 0
}

// startRelayProcess starts this test binary as a relay process named name
// on the scenario's schema and broker, with the default RelayConfig.
func (s *scenario) startRelayProcess(name string) *childProcess {
	s.t.Helper()
	p := "proc_" + s.db.Schema + "_" + name
	return s.startChild("relay", p,
		relayProcessEnv+"="+p,
		relayProcessDB+"="+s.db.Server.URL,
		relayProcessSchema+"="+s.db.Schema,
		relayProcessBrokers+"="+strings.Join(s.broker.Addrs, ","))
}

// buckets returns the buckets whose advisory locks the sessions of
// application app hold.
func (s *scenario) buckets(app string) []int32 {
	s.t.Helper()
	h := fnv.New32a()
	_, _ = h.Write([]byte("outbox.relay:" + s.db.Schema))
	rows, err := s.db.Pool.Query(context.Background(), `
SELECT l.objid::bigint::int FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid::bigint = $2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND a.application_name = $1
ORDER BY 1`, app, int64(h.Sum32()))
	require.NoError(s.t, err)
	b, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(s.t, err)
	return b
}

// TestScenarioRelayProcessKilled kills a relay process with SIGKILL in the
// middle of a batch, under load, with the default RelayConfig: one relay
// process survives it and a new one is started in its place at once, as a
// supervisor would. Every aggregate of the dead relay's buckets that had
// events waiting must be published again, in order, with nothing lost. The
// test logs the stall: the longest time from the death to the next publish
// of one of those aggregates, and what the relays logged about it.
func TestScenarioRelayProcessKilled(t *testing.T) {
	t.Parallel()
	rng := scenarioRand(t)
	s := newScenario(t, rng, broker(t), 4)
	ctx := context.Background()
	stopConsumer := s.startConsumer()
	const aggregates = 40
	stopWriters := s.startWriters(writeLoad{Writers: 3, Aggregates: aggregates, MaxPerTx: 3, MaxPause: 5 * time.Millisecond})
	a := s.startRelayProcess("a")
	b := s.startRelayProcess("b")
	waitUntil(t, 60*time.Second, "both relay processes to own buckets, 64 in all", func() bool {
		return len(s.buckets(a.name)) == 32 && len(s.buckets(b.name)) == 32
	})
	s.waitProgress(300)

	// A burst of writes, committed at once, keeps both relays busy with
	// full batches for a while; kill a while it has a batch claimed and not
	// yet marked. On kfake, every produce request is held for 300 ms
	// meanwhile, so that the batch is still in flight when the kill lands,
	// and one that arrived before the kill is then dropped with its
	// connection, unapplied: the dead relay's records never reach the
	// topic, as when a process dies before its client sent them. (The
	// others' clients send theirs again.)
	var killedAt atomic.Pointer[time.Time]
	if fake := s.broker.Fake; fake != nil {
		var slow atomic.Bool
		slow.Store(true)
		fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
			fake.KeepControl()
			if !slow.Load() {
				return nil, nil, false
			}
			arrived := time.Now()
			fake.SleepControl(func() { time.Sleep(300 * time.Millisecond) })
			if k := killedAt.Load(); k != nil && arrived.Before(*k) {
				return nil, errors.New("connection dropped on purpose"), true
			}
			return nil, nil, false
		})
		defer slow.Store(false)
	}
	burst := make([]producer.Event, 20000)
	for i := range burst {
		burst[i] = s.event(fmt.Sprintf("agg-%03d", i%aggregates))
	}
	_, ok := s.attempt(burst, false)
	require.True(t, ok, "the burst did not commit")
	var owned []int32
	leasedIn := func(buckets []int32) int {
		var n int
		require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s.db.Table("events")+`
WHERE published_at IS NULL AND leased_until > now()
  AND ((hashtext(aggregate_type || ':' || aggregate_id) % 64) + 64) % 64 = ANY($1)`, buckets).Scan(&n))
		return n
	}
	var leasedAtDeath int
	waitUntil(t, 60*time.Second, "relay a mid-batch", func() bool {
		owned = s.buckets(a.name)
		leasedAtDeath = leasedIn(owned)
		return leasedAtDeath > 0
	})
	now := time.Now()
	killedAt.Store(&now)
	a.kill(t)
	var died, leaseEnd time.Time
	require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT clock_timestamp(), coalesce(max(leased_until), clock_timestamp()) FROM `+s.db.Table("events")+`
WHERE published_at IS NULL AND leased_until > now()
  AND ((hashtext(aggregate_type || ':' || aggregate_id) % 64) + 64) % 64 = ANY($1)`, owned).Scan(&died, &leaseEnd))
	// The aggregates of the dead relay's buckets that have events waiting.
	rows, err := s.db.Pool.Query(ctx, `SELECT DISTINCT aggregate_id FROM `+s.db.Table("events")+`
WHERE published_at IS NULL AND ((hashtext(aggregate_type || ':' || aggregate_id) % 64) + 64) % 64 = ANY($1)`, owned)
	require.NoError(t, err)
	waiting, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, waiting, "the dead relay's buckets had nothing waiting")
	c := s.startRelayProcess("c")

	// Every waiting aggregate is published again; the stall of each is the
	// time from the death to its first publish after it.
	var stalls []time.Duration
	waitUntil(t, 120*time.Second, "every aggregate of the dead relay published again", func() bool {
		rows, err := s.db.Pool.Query(ctx, `SELECT aggregate_id, min(published_at) FROM `+s.db.Table("events")+`
WHERE aggregate_id = ANY($1) AND published_at > $2 GROUP BY aggregate_id`, waiting, died)
		require.NoError(t, err)
		stalls = stalls[:0]
		for rows.Next() {
			var agg string
			var at time.Time
			require.NoError(t, rows.Scan(&agg, &at))
			stalls = append(stalls, at.Sub(died))
		}
		require.NoError(t, rows.Err())
		return len(stalls) == len(waiting)
	})
	slices.Sort(stalls)
	t.Logf("relay a killed with %d rows leased in its %d buckets; %d of its aggregates had events waiting; stall from its death to their next publish: median %s, max %s",
		leasedAtDeath, len(owned), len(waiting), stalls[len(stalls)/2].Round(time.Millisecond), stalls[len(stalls)-1].Round(time.Millisecond))
	// The relays that took the dead one's buckets say what they wait for.
	// They must when they took them while its leases ran: the look-up
	// after taking buckets finds the leased rows then. Taken after the
	// leases ended (a slow machine, a late rebalance), there is nothing to
	// hold.
	held := false
	var tookAt time.Time
	for _, p := range []*childProcess{b, c} {
		for _, line := range strings.Split(p.log(), "\n") {
			if strings.Contains(line, "level=WARN") {
				t.Logf("relay %s: %s", p.name, line)
			}
			held = held || strings.Contains(line, `level=WARN msg="relay: holding back aggregates`) && strings.Contains(line, "until=")
			if at, ok := loggedAt(line, `msg="relay: took buckets"`); ok && at.After(died) && (tookAt.IsZero() || at.Before(tookAt)) {
				tookAt = at
			}
		}
	}
	t.Logf("the dead relay's leases ran until %s after its death; its buckets were first taken %s after it",
		leaseEnd.Sub(died).Round(time.Millisecond), tookAt.Sub(died).Round(time.Millisecond))
	// A second for the look-up that follows the taking.
	if !tookAt.IsZero() && tookAt.Before(leaseEnd.Add(-time.Second)) {
		require.True(t, held, "buckets with leased rows were taken before the leases ended, and no relay logged at WARN what it waited for")
	}

	s.waitProgress(300) // writes go on behind the successors
	stopWriters()
	s.drain(90 * time.Second)
	stopConsumer()
	s.check()
}

// loggedAt returns the time of a slog text line that contains msg.
func loggedAt(line, msg string) (time.Time, bool) {
	if !strings.Contains(line, msg) || !strings.HasPrefix(line, "time=") {
		return time.Time{}, false
	}
	field, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
	at, err := time.Parse(time.RFC3339Nano, field)
	return at, err == nil
}
