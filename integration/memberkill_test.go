package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/d419a114/outbox/consumer"
)

// memberProcessEnv, set in the environment of this test binary, makes it
// run one group member (consumer.New + Run, the SDK's default Config and
// client options) instead of the tests (see TestMain), configured by the
// variables below, until SIGTERM or SIGKILL. Its handler writes one effect
// row per event: the event, its partition, the member and the time.
const (
	memberProcessEnv     = "OUTBOX_TEST_MEMBER_PROCESS"
	memberProcessDB      = "OUTBOX_TEST_MEMBER_DATABASE_URL"
	memberProcessSchema  = "OUTBOX_TEST_MEMBER_SCHEMA"
	memberProcessTable   = "OUTBOX_TEST_MEMBER_TABLE"
	memberProcessBrokers = "OUTBOX_TEST_MEMBER_BROKERS"
	memberProcessTopic   = "OUTBOX_TEST_MEMBER_TOPIC"
	memberProcessGroup   = "OUTBOX_TEST_MEMBER_GROUP"
	// memberProcessClassic, when set, makes the member use the classic
	// group protocol; see memberKillProtocolEnv.
	memberProcessClassic = "OUTBOX_TEST_MEMBER_CLASSIC"
)

// memberKillProtocolEnv=classic makes TestMemberKilledLatency's members
// use the classic group protocol, for the baseline: the consumer group
// heartbeat is capped at version 0, below what franz-go's KIP-848 support
// needs, and the session is 6 s, the broker's default minimum for the
// classic protocol (group.min.session.timeout.ms), with heartbeats every
// second.
const memberKillProtocolEnv = "MEMBER_KILL_PROTOCOL"

// memberProcessMain runs the Consumer of a member process; memberProcessEnv
// is the member's name.
func memberProcessMain() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	name, table := os.Getenv(memberProcessEnv), os.Getenv(memberProcessTable)
	pool, err := pgxpool.New(ctx, os.Getenv(memberProcessDB))
	if err != nil {
		log.Error("member process: connect", slog.String("error", err.Error()))
		return 2
	}
	defer pool.Close()
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(strings.Split(os.Getenv(memberProcessBrokers), ",")...),
		kgo.ConsumerGroup(os.Getenv(memberProcessGroup)),
		kgo.ConsumeTopics(os.Getenv(memberProcessTopic)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}, consumer.ClientOpts()...)
	if os.Getenv(memberProcessClassic) != "" {
		v := kversion.Stable()
		v.SetMaxKeyVersion(int16(kmsg.ConsumerGroupHeartbeat), 0)
		opts = append(opts, kgo.MaxVersions(v), kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(time.Second))
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		log.Error("member process: kafka client", slog.String("error", err.Error()))
		return 2
	}
	defer client.Close()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_id, part, member) VALUES ($1, $2, $3)`, m.IdempotencyKey, m.Partition, name)
		return err
	})
	c, err := consumer.New(pool, client, "ledger", h, &consumer.Config{Schema: os.Getenv(memberProcessSchema), Logger: log})
	if err != nil {
		log.Error("member process: new consumer", slog.String("error", err.Error()))
		return 2
	}
	if err := c.Run(ctx); err != nil {
		log.Error("member process: run", slog.Any("error", err))
		return 1
	}
	return 0
}

// startMemberProcess starts this test binary as member name of the
// scenario's group, writing its effects into table.
func (s *scenario) startMemberProcess(name, group, table string) *childProcess {
	s.t.Helper()
	env := []string{
		memberProcessEnv + "=" + name,
		memberProcessDB + "=" + s.db.Server.URL,
		memberProcessSchema + "=" + s.db.Schema,
		memberProcessTable + "=" + table,
		memberProcessBrokers + "=" + strings.Join(s.broker.Addrs, ","),
		memberProcessTopic + "=" + s.topic,
		memberProcessGroup + "=" + group,
	}
	if os.Getenv(memberKillProtocolEnv) == "classic" {
		env = append(env, memberProcessClassic+"=1")
	}
	return s.startChild("member", name, env...)
}

// effect is one row of the member processes' effects table.
type effect struct {
	part    int32
	member  string
	applied time.Time
}

// latencies summarises commit-to-effect times.
type latencies []time.Duration

func (l latencies) String() string {
	if len(l) == 0 {
		return "no events"
	}
	s := slices.Clone(l)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", len(s), q(0.50).Round(100*time.Microsecond),
		q(0.99).Round(100*time.Microsecond), s[len(s)-1].Round(100*time.Microsecond))
}

func (l latencies) p99() time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(0.99*float64(len(s))))]
}

// TestMemberKilledLatency measures what a group member's death costs the
// others. Three members run as child processes with the SDK's defaults
// (consumer.ClientOpts, a zero consumer.Config) over 12 partitions while
// writers commit about 150 events/s; after an undisturbed phase one member
// is killed with SIGKILL, and writing goes on for 30 s. The test logs the
// commit-to-effect latency (the writer's commit returned → the effect row's
// insert in the handler's transaction) of the undisturbed phase, of the
// surviving members' partitions and of the dead member's partitions after
// the kill, and how long the dead member's partitions waited for their
// first effect. Under the consumer group protocol (KIP-848) only the dead
// member's partitions wait, for about the broker's
// group.consumer.session.timeout.ms; under the classic protocol every
// partition waits. Its correctness checks: every committed event applied
// exactly once, in sequence order per aggregate; the dead member's
// partitions resumed within two minutes. It also logs the longest time
// after the kill in which no member applied anything. With
// MEMBER_KILL_PROTOCOL=classic the members use the classic protocol, for
// the baseline. docs/performance.md has the figures.
func TestMemberKilledLatency(t *testing.T) {
	t.Parallel()
	memberKills(t, 3, 0)
}

// TestTwoMembersKilledLatency is TestMemberKilledLatency with four members
// of which two are killed 2 s apart, closer together than the session
// timeout: under the classic protocol the second death lands in the
// rebalance the first one started, which chained two session timeouts
// into one stall of the whole group; under the consumer protocol each
// dead member's partitions wait for its own session alone, and the
// others go on.
func TestTwoMembersKilledLatency(t *testing.T) {
	t.Parallel()
	memberKills(t, 4, 2*time.Second)
}

// memberKills runs n members, kills one (and, if gap is not zero, another
// one gap later) and checks and logs what TestMemberKilledLatency says.
func memberKills(t *testing.T, n int, gap time.Duration) {
	rng := scenarioRand(t)
	s := newScenario(t, rng, broker(t), 12)
	ctx := context.Background()
	table := s.db.Table("kill_effects")
	_, err := s.db.Pool.Exec(ctx, `CREATE TABLE `+table+` (
		n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id text NOT NULL, part int NOT NULL,
		member text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
	group := "group-" + s.topic

	s.startRelay("a", scenarioRelayConfig(), nil)
	var members []*childProcess
	for i := range n {
		members = append(members, s.startMemberProcess(fmt.Sprintf("m%d", i+1), group, table))
	}
	stopWriters := s.startWriters(writeLoad{Writers: 2, Aggregates: 300, MaxPerTx: 1, MaxPause: 20 * time.Millisecond})

	// Every member owns partitions, and every partition flows.
	owners := func(since time.Time) map[int32]string {
		rows, err := s.db.Pool.Query(ctx, `SELECT DISTINCT ON (part) part, member FROM `+table+` WHERE applied_at >= $1 ORDER BY part, n DESC`, since)
		require.NoError(t, err)
		m := map[int32]string{}
		for rows.Next() {
			var p int32
			var who string
			require.NoError(t, rows.Scan(&p, &who))
			m[p] = who
		}
		require.NoError(t, rows.Err())
		return m
	}
	waitUntil(t, 120*time.Second, fmt.Sprintf("all 12 partitions applied by %d members", n), func() bool {
		o := owners(time.Now().Add(-2 * time.Second))
		who := map[string]bool{}
		for _, m := range o {
			who[m] = true
		}
		return len(o) == 12 && len(who) == n
	})
	waitUntil(t, 120*time.Second, fmt.Sprintf("the group stable with %d members", n), func() bool { return groupStable(t, s, group, n) })
	t.Logf("group protocol: %s", groupProtocol(t, s, group))
	time.Sleep(2 * time.Second) // the members' last moves settle

	calmFrom := time.Now()
	time.Sleep(20 * time.Second) // the undisturbed phase: load runs, nothing is done to the group
	calmTo := time.Now()
	victims := members[:1]
	if gap > 0 {
		victims = members[:2]
	}
	owned := owners(calmTo.Add(-3 * time.Second))
	// killedAt is when each dead partition's owner was killed.
	killedAt := map[int32]time.Time{}
	var dead []int32
	firstKill := time.Now()
	for i, v := range victims {
		if i > 0 {
			time.Sleep(gap)
		}
		at := time.Now()
		v.kill(t)
		var its []int32
		for p, m := range owned {
			if m == v.name {
				its = append(its, p)
				killedAt[p] = at
			}
		}
		require.NotEmpty(t, its, "victim %s owns partitions", v.name)
		dead = append(dead, its...)
	}
	slices.Sort(dead)
	time.Sleep(30 * time.Second) // the load goes on after the kills
	afterTo := time.Now()
	stopWriters()

	// Drain: every committed event applied.
	committed := func() map[string]time.Time {
		s.mu.Lock()
		defer s.mu.Unlock()
		return maps.Clone(s.committed)
	}()
	waitUntil(t, 120*time.Second, "every committed event applied", func() bool {
		var n int
		require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM `+table).Scan(&n))
		return n >= len(committed)
	})

	effects := map[string]effect{}
	var rowsN int
	rows, err := s.db.Pool.Query(ctx, `SELECT event_id, part, member, applied_at FROM `+table+` ORDER BY n`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var e effect
		require.NoError(t, rows.Scan(&id, &e.part, &e.member, &e.applied))
		rowsN++
		if _, seen := effects[id]; !seen {
			effects[id] = e
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(effects), rowsN, "each event's effect applied once")
	for id := range committed {
		require.Contains(t, effects, id, "committed event applied")
	}
	s.checkSequenceOrder(table)

	var calm, survivors, deadParts latencies
	resumed := map[int32]time.Duration{}
	for id, at := range committed {
		e := effects[id]
		d := e.applied.Sub(at)
		kill, isDead := killedAt[e.part]
		switch {
		case at.After(calmFrom) && at.Before(calmTo):
			calm = append(calm, d)
		case at.After(firstKill) && at.Before(afterTo):
			if isDead {
				deadParts = append(deadParts, d)
			} else {
				survivors = append(survivors, d)
			}
		}
		if isDead && e.applied.After(kill) && e.member != owned[e.part] {
			if w, ok := resumed[e.part]; !ok || e.applied.Sub(kill) < w {
				resumed[e.part] = e.applied.Sub(kill)
			}
		}
	}
	// The longest time after the first kill in which no member applied
	// anything: the group-wide stall the classic protocol has.
	var applied []time.Time
	for _, e := range effects {
		if e.applied.After(firstKill) && e.applied.Before(afterTo) {
			applied = append(applied, e.applied)
		}
	}
	applied = append(applied, firstKill)
	slices.SortFunc(applied, time.Time.Compare)
	var stall time.Duration
	for i := 1; i < len(applied); i++ {
		stall = max(stall, applied[i].Sub(applied[i-1]))
	}
	var worst time.Duration
	for _, p := range dead {
		w, ok := resumed[p]
		require.True(t, ok, "partition %d of a dead member resumed", p)
		worst = max(worst, w)
	}
	require.Less(t, worst, 2*time.Minute, "the dead members' partitions resumed")
	t.Logf("undisturbed (20 s, all partitions):         %v", calm)
	t.Logf("after the kills, surviving members' partitions (30 s): %v", survivors)
	t.Logf("after the kills, dead members' partitions %v (30 s): %v", dead, deadParts)
	t.Logf("dead members' partitions resumed (their owner's kill → first effect elsewhere): slowest %v, each %v", worst.Round(time.Millisecond), resumed)
	t.Logf("longest time after the first kill in which no member applied anything: %v", stall.Round(time.Millisecond))
	t.Logf("FIGURES kills=%d gap=%v calm_p99=%v survivors_p99=%v (+%v) dead_p99=%v resumed_within=%v group_stall=%v",
		len(victims), gap, calm.p99().Round(100*time.Microsecond), survivors.p99().Round(100*time.Microsecond),
		(survivors.p99() - calm.p99()).Round(100*time.Microsecond), deadParts.p99().Round(time.Millisecond), worst.Round(time.Millisecond),
		stall.Round(time.Millisecond))
}

// checkSequenceOrder requires that, per aggregate, the effects in table
// were applied in the writer's sequence order.
func (s *scenario) checkSequenceOrder(table string) {
	s.t.Helper()
	var reorders int
	err := s.db.Pool.QueryRow(context.Background(), `
SELECT count(*) FROM (
  SELECT e.aggregate_seq AS seq, lag(e.aggregate_seq) OVER (PARTITION BY e.aggregate_id ORDER BY k.n) AS prev
  FROM `+table+` k JOIN `+s.db.Table("events")+` e ON e.idempotency_key = k.event_id
) x WHERE prev IS NOT NULL AND seq <> prev + 1`).Scan(&reorders)
	require.NoError(s.t, err)
	require.Zero(s.t, reorders, "effects applied out of sequence order")
}

// groupProtocol says which protocol the group runs: "consumer (KIP-848)"
// when the broker describes it as a consumer group, otherwise "classic".
func groupProtocol(t *testing.T, s *scenario, group string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gs, err := kadm.NewClient(s.broker.Client(t)).DescribeConsumerGroups(ctx, group)
	if err != nil {
		return "classic (ConsumerGroupDescribe failed: " + err.Error() + ")"
	}
	g := gs[group]
	switch {
	case errors.Is(g.Err, kerr.GroupIDNotFound):
		return "classic"
	case g.Err != nil:
		return "classic (" + g.Err.Error() + ")"
	}
	return fmt.Sprintf("consumer (KIP-848), %d members, group epoch %d", len(g.Members), g.Epoch)
}

// groupStable says whether group is stable with n members, each owning
// partitions, whichever protocol it runs.
func groupStable(t *testing.T, s *scenario, group string, n int) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(s.broker.Client(t))
	if gs, err := adm.DescribeConsumerGroups(ctx, group); err == nil && gs[group].Err == nil {
		g := gs[group]
		if g.State != "Stable" || len(g.Members) != n {
			return false
		}
		for _, m := range g.Members {
			if len(m.Assignment) == 0 {
				return false
			}
		}
		return true
	}
	gs, err := adm.DescribeGroups(ctx, group)
	if err != nil || gs[group].Err != nil {
		return false
	}
	g := gs[group]
	if g.State != "Stable" || len(g.Members) != n {
		return false
	}
	for _, m := range g.Members {
		if a, ok := m.Assigned.AsConsumer(); !ok || len(a.Topics) == 0 {
			return false
		}
	}
	return true
}
