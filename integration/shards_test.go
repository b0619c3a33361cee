package integration

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/integration/history"
)

// TestScenarioManyShards is issue 23's scenario of many databases: three
// PostgreSQL clusters, each with a producer shard; writers over 60
// aggregates on all three, each following its aggregates when a Write says
// they moved; two relay fleets over the three shards, each killed (its
// sessions on every cluster terminated, its Kafka client closed) and
// restarted twice, once alone and once with the other; a consumer group of
// two or three members routing each record to one of two targets by its
// aggregate, members killed (their sessions on both targets terminated; on
// kfake their offset commits refused too) and restarted; and three moves
// of five aggregates between different shards, each started while a fleet
// is down, on a seeded schedule. Every committed event must be applied
// once in its target, each aggregate's effects in dense sequence order
// across its moves, each aggregate's committed sequence numbers must be
// 1..n over the shards it lived on, and the topic must hold each
// aggregate's first copies in sequence order.
func TestScenarioManyShards(t *testing.T) {
	t.Parallel()
	rng := scenarioRand(t)
	w := newShardWorld(t, broker(t), 6)
	g := &routingGroup{w: w, outcomes: outcomes{rec: &w.rec}}
	concurrency := 1 + 3*rng.IntN(2)
	members := 2 + rng.IntN(2)
	for range members {
		g.start(concurrency)
	}
	const aggregates = 60
	stopWriters := w.startWriters(rng, 4, aggregates, 0.1, 10*time.Millisecond)
	fleets := map[string]*fleetProcess{"a": w.startFleet("a", 1), "b": w.startFleet("b", 1)}
	incarnations := map[string]int{"a": 1, "b": 1}

	// Every fleet step starts a move while the fleet is down, so that the
	// move waits for the dead fleet's buckets and leases (for the
	// restart, when both are down) and runs alongside the next steps.
	mv := w.newMover(rng, aggregates)
	steps := []string{"fleet a", "fleet b", "fleet a b", "member", "member", "member"}
	rng.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
	var log []string
	for i, step := range steps {
		down := time.Duration(100+rng.IntN(700)) * time.Millisecond
		if names, ok := strings.CutPrefix(step, "fleet "); ok {
			// The previous move may still wait for a fleet to deliver
			// (a lease of a fleet killed before it); with every fleet
			// down it would wait forever.
			mv.wait()
			what := ""
			for _, name := range strings.Fields(names) {
				n := w.killFleet(fleets[name])
				what += fmt.Sprintf("kill fleet %s (%d sessions), ", name, n)
			}
			what += mv.start()
			pause(context.Background(), down)
			for _, name := range strings.Fields(names) {
				incarnations[name]++
				fleets[name] = w.startFleet(name, incarnations[name])
			}
			log = append(log, fmt.Sprintf("%s, restart after %v", what, down))
		} else {
			m, n := g.kill(rng.IntN(len(g.members)))
			pause(context.Background(), down)
			g.start(concurrency)
			log = append(log, fmt.Sprintf("kill member %s (%d sessions), restart after %v", m.name, n, down))
		}
		g.waitApplied(g.applied()+100+rng.IntN(200), 60*time.Second, fmt.Sprintf("step %d (%v)", i, log))
	}
	mv.wait()
	t.Logf("schedule (%d members at Concurrency %d): %v", members, concurrency, log)
	t.Logf("moves: %v", mv.log)
	g.waitApplied(g.applied()+100, 60*time.Second, "traffic after the last move")
	// Enough traffic for the check below to say something, whatever the
	// steps' waits added up to (each ends early once the group caught up).
	waitUntil(t, 60*time.Second, "more than 1,000 events committed", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.committed) > 1000
	})
	stopWriters()

	g.drain(90 * time.Second)
	for _, f := range fleets {
		w.stopFleet(f)
	}
	w.mu.Lock()
	t.Logf("writes refused as moved: %d (%d while arriving); write errors: %d", w.redirected, w.arriving, w.writeErrors)
	w.mu.Unlock()
	rep := w.rec.Check()
	t.Logf("history:\n%s", rep)
	seed, _ := baseSeed()
	require.Greater(t, rep.Committed, 1000, "too little traffic to say anything")
	require.True(t, rep.OK(), "the history breaks a guarantee (%s=%d reproduces the schedule):\n%s", seedEnv, seed, rep)
	g.settled()
	w.checkSequences(mv.moved)
	w.checkWire()
}

// checkWire reads the topic back and requires that, per aggregate, the
// first copies of its records are on the wire in sequence order across its
// moves, whatever the consumer's ordering would have repaired: nothing
// lost, no reorder.
func (w *shardWorld) checkWire() {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(w.broker.Client(w.t)).ListEndOffsets(ctx, w.topic)
	require.NoError(w.t, err)
	require.NoError(w.t, ends.Error())
	want := 0
	ends.Each(func(o kadm.ListedOffset) { want += int(o.Offset) })
	var wire history.Recorder
	w.mu.Lock()
	committed := slices.Clone(w.committed)
	w.mu.Unlock()
	for _, h := range committed {
		wire.Write(h)
	}
	seen := map[string]bool{}
	for _, r := range w.broker.Records(w.t, w.topic, want, 60*time.Second) {
		h := map[string]string{}
		for _, hd := range r.Headers {
			h[hd.Key] = string(hd.Value)
		}
		key := h[outbox.HeaderIdempotencyKey]
		seq, err := strconv.ParseInt(h[outbox.HeaderAggregateSeq], 10, 64)
		require.NoError(w.t, err, "record at p%d@%d has no sequence number", r.Partition, r.Offset)
		wire.Handle(history.Handle{
			Key:       key,
			Aggregate: history.Aggregate{Type: h[outbox.HeaderAggregateType], ID: h[outbox.HeaderAggregateID]},
			Seq:       seq,
			Applied:   !seen[key],
			Where:     fmt.Sprintf("p%d@%d", r.Partition, r.Offset),
		})
		seen[key] = true
	}
	rep := wire.Check()
	require.Zero(w.t, rep.Lost, "committed events missing from the topic:\n%s", rep)
	require.Zero(w.t, rep.Reorders, "records on the wire out of sequence order:\n%s", rep)
	w.t.Logf("on the wire: %d records, %d events, %d copies beyond the first, no reorder", rep.Handles, rep.Applied, rep.Redeliveries)
}

// checkSequences requires that each aggregate's committed sequence numbers
// are exactly 1..n, whichever shards it was written on, and that the moved
// aggregates were written on more than one shard, the sequence going on
// where it left off.
func (w *shardWorld) checkSequences(moved []string) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for agg, seqs := range w.seqs {
		got := make([]int64, len(seqs))
		for i, s := range seqs {
			got[i] = s.seq
		}
		slices.Sort(got)
		for i, s := range got {
			require.Equal(w.t, int64(i+1), s, "%s: committed sequence numbers %v are not 1..%d", agg, got, len(got))
		}
	}
	moves := map[string]int{}
	for _, agg := range moved {
		moves[agg]++
	}
	across := 0
	for agg, seqs := range w.seqs {
		seqs = slices.Clone(seqs)
		slices.SortFunc(seqs, func(a, b shardSeq) int { return cmp.Compare(a.seq, b.seq) })
		// In sequence order, an aggregate's shard changes only at a move:
		// once it left a shard, nothing of it was written there again.
		changes := 0
		for i := 1; i < len(seqs); i++ {
			if seqs[i].shard != seqs[i-1].shard {
				changes++
			}
		}
		require.LessOrEqual(w.t, changes, moves[agg], "%s changed shards more often than it moved", agg)
		if changes > 0 {
			across++
		}
	}
	require.Positive(w.t, across, "no moved aggregate was written on both sides of its move")
	w.t.Logf("%d of %d moved aggregates were written on both sides of their move", across, len(moves))
}
