package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/ordering"
	"github.com/d419a114/outbox/producer"
)

// TestScenarioMembersComeAndGo is scenario 3 with the SDK's consumer: many
// writers over many aggregates, relays started and stopped (one to three at
// a time), and consumer group members joining and leaving (one to three at
// a time), on a seeded schedule. Every committed event must be applied
// once, each aggregate's effects in dense sequence order.
func TestScenarioMembersComeAndGo(t *testing.T) { atConcurrency(t, membersComeAndGo) }

func membersComeAndGo(t *testing.T, concurrency int) {
	rng := scenarioRand(t)
	s := newScenario(t, rng, broker(t), 6)
	g := s.newGroup(consumer.Config{Concurrency: concurrency})
	g.start()
	stopWriters := s.startWriters(writeLoad{Writers: 6, Aggregates: 100, MaxPerTx: 4, Rollback: 0.1, MaxPause: 5 * time.Millisecond, Limit: 8000})

	cfg := scenarioRelayConfig()
	var relays []*relay
	started := 0
	startRelay := func() {
		started++
		relays = append(relays, s.startRelay(fmt.Sprintf("r%d", started), cfg, nil))
	}
	startRelay()
	startRelay()
	var log []string
	for step := range 10 {
		if rng.IntN(2) == 0 {
			// A relay change.
			if len(relays) < 3 && (len(relays) <= 1 || rng.IntN(2) == 0) {
				startRelay()
				log = append(log, "start "+relays[len(relays)-1].name)
			} else {
				i := rng.IntN(len(relays))
				r := relays[i]
				relays = append(relays[:i], relays[i+1:]...)
				if rng.IntN(2) == 0 {
					r.stop()
					log = append(log, "stop "+r.name)
				} else {
					n := s.terminate(r.app)
					r.stop()
					log = append(log, fmt.Sprintf("kill %s (%d sessions)", r.name, n))
				}
			}
		} else {
			// A member change.
			members := g.running()
			if len(members) < 3 && (len(members) <= 1 || rng.IntN(2) == 0) {
				m := g.start()
				log = append(log, "join "+m.name)
			} else {
				m := g.leave(rng.IntN(len(members)))
				log = append(log, "leave "+m.name)
			}
		}
		g.waitApplied(g.applied()+150+rng.IntN(300), 60*time.Second, fmt.Sprintf("step %d (%v)", step, log))
	}
	t.Logf("schedule: %v", log)
	stopWriters()
	if len(g.running()) == 0 {
		g.start()
	}
	g.drain(90 * time.Second)
	for _, r := range relays {
		r.stop()
	}
	rep := s.check()
	g.settled()
	require.Greater(t, rep.Committed, 1000, "too little traffic to say anything")
}

// TestScenarioConsumerCrashes is scenario 4: members crash between their
// database commit and their offset commit (the broker fails every offset
// commit of the group while a member is stopped, so the effects it applied
// are never acknowledged and come back to the next owner of the
// partitions), offset commits fail now and then, and partition leaders move
// while the members consume. Redeliveries must be skipped: nothing lost,
// no phantom, no duplicate effect, no reorder. kfake only: the faults and
// the leader moves need it.
func TestScenarioConsumerCrashes(t *testing.T) { atConcurrency(t, consumerCrashes) }

func consumerCrashes(t *testing.T, concurrency int) {
	rng := scenarioRand(t)
	b := kafkatest.NewFake(t)
	fake := b.Fake
	s := newScenario(t, rng, b, 4)
	g := s.newGroup(consumer.Config{MaxPollRecords: 50, Concurrency: concurrency})
	g.start()
	g.start()
	stopWriters := s.startWriters(writeLoad{Writers: 6, Aggregates: 80, MaxPerTx: 4, Rollback: 0.1, MaxPause: 5 * time.Millisecond, Limit: 9000})
	cfg := scenarioRelayConfig()
	relays := []*relay{s.startRelay("r1", cfg, nil), s.startRelay("r2", cfg, nil)}

	var log []string
	crashes := 0
	for step := range 12 {
		switch k := rng.IntN(4); {
		case k == 0 || (step == 11 && crashes == 0):
			// A crash: effects committed, offsets never.
			// The member crashed is one whose own commit this fault
			// refused: it holds applied effects the group never
			// acknowledged. (An earlier counted fault answers first
			// while it lasts, so a commit failing is not enough.)
			crashes++
			var refused sync.Map
			h := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: g.group, Err: kerr.RebalanceInProgress, Count: -1,
				When: func(r kmsg.Request) bool {
					if oc, ok := r.(*kmsg.OffsetCommitRequest); ok {
						refused.Store(oc.MemberID, true)
					}
					return true
				}})
			g.waitApplied(g.applied()+50+rng.IntN(100), 60*time.Second, "applied while offset commits fail")
			victim := -1
			waitUntil(t, 30*time.Second, "a member's offset commit to fail", func() bool {
				for i, m := range g.running() {
					if id, _ := m.client.GroupMetadata(); id != "" {
						if _, ok := refused.Load(id); ok {
							victim = i
							return true
						}
					}
				}
				return false
			})
			m := g.leave(victim)
			h.Remove()
			g.start()
			log = append(log, fmt.Sprintf("crash %s after %d failed commits", m.name, h.Hits()))
		case k == 1:
			n := 1 + rng.IntN(4)
			fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: g.group, Err: kerr.CoordinatorNotAvailable, Count: n})
			log = append(log, fmt.Sprintf("fail %d offset commits", n))
		case k == 2:
			p := int32(rng.IntN(4))
			to := (fake.LeaderFor(s.topic, p) + 1 + int32(rng.IntN(2))) % 3
			require.NoError(t, fake.MoveTopicPartition(s.topic, p, to))
			log = append(log, fmt.Sprintf("move partition %d to node %d", p, to))
		default:
			fake.ShufflePartitionLeaders()
			log = append(log, "shuffle leaders")
		}
		g.waitApplied(g.applied()+100+rng.IntN(200), 60*time.Second, fmt.Sprintf("step %d (%v)", step, log))
	}
	t.Logf("schedule: %v", log)
	stopWriters()
	g.drain(90 * time.Second)
	for _, r := range relays {
		r.stop()
	}
	rep := s.check()
	g.settled()
	require.Positive(t, rep.Redeliveries, "no member crashed with unacknowledged effects: the scenario did not test dedupe")
	require.Positive(t, g.duplicates.Load())
}

// poisonAggregate is the aggregate whose handler fails in
// TestScenarioPoisonAggregate.
const poisonAggregate = "agg-007"

// TestScenarioPoisonAggregate is scenario 6: the handler fails for one
// aggregate until it is fixed. Its first failing event is dead-lettered and
// its successors parked while every other aggregate flows; after the fix,
// replaying the dead letter applies it once and drains the successors in
// order.
func TestScenarioPoisonAggregate(t *testing.T) { atConcurrency(t, poisonAggregateScenario) }

func poisonAggregateScenario(t *testing.T, concurrency int) {
	rng := scenarioRand(t)
	s := newScenario(t, rng, broker(t), 4)
	g := s.newGroup(consumer.Config{MaxAttempts: 2, Concurrency: concurrency})
	var broken atomic.Bool
	broken.Store(true)
	var failures atomic.Int64
	fail := func(m *consumer.Message) error {
		if broken.Load() && m.AggregateID == poisonAggregate {
			failures.Add(1)
			return errors.New("poison: the handler cannot apply " + poisonAggregate)
		}
		return nil
	}
	g.fail.Store(&fail)
	g.start()
	g.start()
	cfg := scenarioRelayConfig()
	r1, r2 := s.startRelay("r1", cfg, nil), s.startRelay("r2", cfg, nil)
	aggregates := 10 + rng.IntN(10)
	for range 400 + rng.IntN(300) {
		events := make([]producer.Event, 1+rng.IntN(3))
		for i := range events {
			events[i] = s.event(fmt.Sprintf("agg-%03d", rng.IntN(aggregates)))
		}
		_, ok := s.attempt(events, rng.Float64() < 0.1)
		require.True(t, ok)
	}

	// Every event of the other aggregates is applied while the poisoned one
	// is held.
	ctx := context.Background()
	var others []string
	rows, err := s.db.Pool.Query(ctx, `SELECT event_id::text FROM `+s.db.Table("events")+` WHERE aggregate_id <> $1`, poisonAggregate)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		others = append(others, id)
	}
	require.NoError(t, rows.Err())
	waitUntil(t, 90*time.Second, "every event of the healthy aggregates applied", func() bool { return g.unapplied(others) == 0 })
	var poisoned int
	require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s.db.Table("events")+` WHERE aggregate_id = $1`, poisonAggregate).Scan(&poisoned))
	require.Greater(t, poisoned, 1, "the poisoned aggregate needs successors")
	proc := g.running()[0].c.Processor()
	var letters []*deadletter.Letter
	waitUntil(t, 60*time.Second, "the poisoned aggregate dead-lettered, its successors parked", func() bool {
		reads := proc.Inspector()
		letters, err = reads.Letters(ctx, &deadletter.ListOpts{Consumer: g.name, Status: deadletter.StatusDead})
		require.NoError(t, err)
		gaps, err := reads.Gaps(ctx, &ordering.GapOpts{Consumer: g.name, AggregateType: "account", AggregateID: poisonAggregate})
		require.NoError(t, err)
		waiting := 0
		for _, gp := range gaps.Gaps {
			if gp.Aggregate == (ordering.Aggregate{Type: "account", ID: poisonAggregate}) && gp.DeadLetterID != 0 {
				waiting = gp.Parked
			}
		}
		return len(letters) >= 1 && waiting == poisoned-1
	})
	for _, l := range letters {
		require.Equal(t, poisonAggregate, l.AggregateID)
		require.Equal(t, letters[0].Seq, l.Seq, "only the head of the poisoned aggregate may be dead-lettered")
	}
	var applied int
	require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s.db.Table("effects")+` WHERE aggregate_id = $1`, poisonAggregate).Scan(&applied))
	require.Zero(t, applied, "an effect of the poisoned aggregate was applied while it was broken")
	t.Logf("dead letter %d (seq %d) holds %d successors after %d failed handler calls", letters[0].ID, letters[0].Seq, poisoned-1, failures.Load())

	// A replay while still broken changes nothing.
	_, err = proc.Replay(ctx, letters[0].ID)
	require.Error(t, err)

	broken.Store(false)
	res, err := proc.Replay(ctx, letters[0].ID)
	require.NoError(t, err)
	require.Equal(t, consumer.Applied, res.Outcome)
	// Replay applies the first 50 successors with the letter; the
	// running consumers' drainers apply the rest.
	require.Equal(t, min(poisoned-1, 50), res.Drained)
	_, err = proc.Replay(ctx, letters[0].ID)
	require.ErrorIs(t, err, deadletter.ErrResolved, "a second replay must be refused")
	for _, l := range letters[1:] { // the head dead-lettered again on a redelivery
		res, err := proc.Replay(ctx, l.ID)
		require.NoError(t, err)
		require.Equal(t, consumer.Duplicate, res.Outcome)
	}

	g.drain(90 * time.Second)
	r1.stop()
	r2.stop()
	s.check()
	g.settled()
}

// atConcurrency runs a consumer scenario with Config.Concurrency 1 and 16.
func atConcurrency(t *testing.T, scenario func(t *testing.T, concurrency int)) {
	t.Parallel()
	for _, c := range []int{1, 16} {
		t.Run(fmt.Sprintf("concurrency=%d", c), func(t *testing.T) {
			t.Parallel()
			scenario(t, c)
		})
	}
}
