package integration

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/move"
)

// TestScenarioManyShards is issue 23's scenario of many databases: three
// PostgreSQL clusters, each with a producer shard; writers over 60
// aggregates on all three, each following its aggregates when a Write says
// they moved; two relay fleets over the three shards, each killed (its
// sessions on every cluster terminated, its Kafka client closed) and
// restarted at least twice; a consumer group routing each record to one of
// two targets by its aggregate, members killed (their sessions on both
// targets terminated) and restarted; and three moves of five aggregates
// between different shards while all this goes on. Every committed event
// must be applied once in its target, each aggregate's effects in dense
// sequence order across its moves, and each aggregate's committed sequence
// numbers must be 1..n over the shards it lived on.
func TestScenarioManyShards(t *testing.T) {
	t.Parallel()
	rng := scenarioRand(t)
	w := newShardWorld(t, broker(t), 6)
	g := &routingGroup{w: w}
	concurrency := 1 + 3*rng.IntN(2)
	g.start(concurrency)
	g.start(concurrency)
	const aggregates = 60
	stopWriters := w.startWriters(rng, 4, aggregates, 0.1, 10*time.Millisecond)
	fleets := map[string]*fleetProcess{"a": w.startFleet("a", 1), "b": w.startFleet("b", 1)}
	incarnations := map[string]int{"a": 1, "b": 1}

	// The moves run alongside the kills, from a source of their own.
	moves := make(chan moveDone, 1)
	moveRng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
	go func() { moves <- w.runMoves(moveRng, aggregates) }()

	steps := []string{"fleet a", "fleet a", "fleet b", "fleet b", "member", "member", "member"}
	rng.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
	var log []string
	for i, step := range steps {
		down := time.Duration(100+rng.IntN(700)) * time.Millisecond
		if name, ok := strings.CutPrefix(step, "fleet "); ok {
			n := w.killFleet(fleets[name])
			pause(context.Background(), down)
			incarnations[name]++
			fleets[name] = w.startFleet(name, incarnations[name])
			log = append(log, fmt.Sprintf("kill fleet %s (%d sessions), restart after %v", name, n, down))
		} else {
			m, n := g.kill(rng.IntN(len(g.members)))
			pause(context.Background(), down)
			g.start(concurrency)
			log = append(log, fmt.Sprintf("kill member %s (%d sessions), restart after %v", m.name, n, down))
		}
		g.waitApplied(g.applied()+100+rng.IntN(200), 60*time.Second, fmt.Sprintf("step %d (%v)", i, log))
	}
	t.Logf("schedule (members at Concurrency %d): %v", concurrency, log)
	var done moveDone
	select {
	case done = <-moves:
	case <-time.After(90 * time.Second):
		t.Fatal("the moves did not finish within 90s of the schedule's end")
	}
	require.NoError(t, done.err)
	t.Logf("moves: %v", done.log)
	g.waitApplied(g.applied()+100, 60*time.Second, "traffic after the last move")
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
	w.checkSequences(done.moved)
}

// moveDone is what runMoves did.
type moveDone struct {
	moved []string // the aggregates moved, once per move
	log   []string
	err   error
}

// runMoves moves five aggregates three times, once between each pair of
// shards in a random direction, each time chosen among those on the
// source (so one may move twice), after a random pause.
func (w *shardWorld) runMoves(rng *rand.Rand, aggregates int) (done moveDone) {
	home := make([]int, aggregates)
	for i := range home {
		home[i] = i % len(w.shards)
	}
	pairs := [][2]int{{0, 1}, {1, 2}, {2, 0}}
	rng.Shuffle(len(pairs), func(i, j int) { pairs[i], pairs[j] = pairs[j], pairs[i] })
	for _, p := range pairs {
		from, to := p[0], p[1]
		if rng.IntN(2) == 0 {
			from, to = to, from
		}
		pause(context.Background(), time.Duration(1000+rng.IntN(3000))*time.Millisecond)
		var on []int
		for i, h := range home {
			if h == from {
				on = append(on, i)
			}
		}
		rng.Shuffle(len(on), func(i, j int) { on[i], on[j] = on[j], on[i] })
		var aggs []move.Aggregate
		var names []string
		for _, i := range on[:5] {
			aggs = append(aggs, move.Aggregate{Type: "account", ID: aggregateName(i)})
			names = append(names, aggregateName(i))
			home[i] = to
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		start := time.Now()
		id, err := move.Run(ctx, w.shards[from].endpoint(), w.shards[to].endpoint(), aggs, &move.Config{PollInterval: 20 * time.Millisecond, Logger: testLogger(w.t, "move")})
		cancel()
		if err != nil {
			done.err = fmt.Errorf("move %s of %v from %s to %s: %w", id, names, w.shards[from].shard.Name, w.shards[to].shard.Name, err)
			return done
		}
		done.moved = append(done.moved, names...)
		done.log = append(done.log, fmt.Sprintf("%v %s→%s in %v", names, w.shards[from].shard.Name, w.shards[to].shard.Name, time.Since(start).Round(time.Millisecond)))
	}
	return done
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
