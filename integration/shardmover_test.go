package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/move"
)

// mover moves five aggregates at a time between shards, one move at a
// time, each between another pair of shards in a random direction, the
// aggregates chosen among those on the source (so one may move twice). Its
// methods are for the test's goroutine; a move runs in a goroutine of its
// own.
type mover struct {
	w     *shardWorld
	rng   *rand.Rand
	home  []int    // the shard of each aggregate once the moves so far finish
	pairs [][2]int // the shards of the moves to come
	moved []string // the aggregates moved, once per move
	log   []string // a line per finished move
	// running delivers the line of the move under way, or its error.
	running chan moveResult
}

type moveResult struct {
	line string
	err  error
}

func (w *shardWorld) newMover(rng *rand.Rand, aggregates int) *mover {
	m := &mover{w: w, rng: rng, home: make([]int, aggregates), pairs: [][2]int{{0, 1}, {1, 2}, {2, 0}}}
	for i := range m.home {
		m.home[i] = i % len(w.shards)
	}
	rng.Shuffle(len(m.pairs), func(i, j int) { m.pairs[i], m.pairs[j] = m.pairs[j], m.pairs[i] })
	return m
}

// start starts the next move and says which. The move before it must have
// ended (wait): waited for here, it could need a fleet the caller has just
// killed, and would wait for the restart that comes after start returns.
func (m *mover) start() string {
	m.w.t.Helper()
	if m.running != nil {
		m.w.t.Fatal("mover.start while a move runs: wait for it before the fleets go down")
	}
	p := m.pairs[0]
	m.pairs = m.pairs[1:]
	from, to := p[0], p[1]
	if m.rng.IntN(2) == 0 {
		from, to = to, from
	}
	var on []int
	for i, h := range m.home {
		if h == from {
			on = append(on, i)
		}
	}
	m.rng.Shuffle(len(on), func(i, j int) { on[i], on[j] = on[j], on[i] })
	var aggs []move.Aggregate
	var names []string
	for _, i := range on[:5] {
		aggs = append(aggs, move.Aggregate{Type: "account", ID: aggregateName(i)})
		names = append(names, aggregateName(i))
		m.home[i] = to
	}
	m.moved = append(m.moved, names...)
	src, dst := m.w.shards[from].endpoint(), m.w.shards[to].endpoint()
	id := fmt.Sprintf("scn-move-%d", len(m.log)+1)
	m.running = make(chan moveResult, 1)
	go func() { m.running <- m.w.runMove(id, src, dst, aggs) }()
	return fmt.Sprintf("move %s of %v %s→%s", id, names, src.Shard.Name, dst.Shard.Name)
}

// wait waits for the move under way, if any, and fails the test if it
// failed.
func (m *mover) wait() {
	m.w.t.Helper()
	if m.running == nil {
		return
	}
	var res moveResult
	select {
	case res = <-m.running:
	case <-time.After(90 * time.Second):
		m.w.t.Fatal("a move did not return within 90s")
	}
	m.running = nil
	require.NoError(m.w.t, res.err)
	m.log = append(m.log, res.line)
}

// runMove runs move id and says how long it took and the most events it
// saw waited for on the source and held on the target.
func (w *shardWorld) runMove(id string, src, dst move.Endpoint, aggs []move.Aggregate) moveResult {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan move.Status, 1)
	go func() { watched <- watchMove(watchCtx, id, src, dst) }()
	start := time.Now()
	// AllowNew: an aggregate chosen may have no event yet, and its source
	// is its home, so it has none anywhere else either.
	_, err := move.Run(ctx, src, dst, aggs, &move.Config{ID: id, PollInterval: 20 * time.Millisecond, Logger: testLogger(w.t, "move"), AllowNew: true})
	took := time.Since(start)
	stopWatch()
	most := <-watched
	if err != nil {
		return moveResult{err: fmt.Errorf("move %s from %s to %s: %w", id, src.Shard.Name, dst.Shard.Name, err)}
	}
	return moveResult{line: fmt.Sprintf("%s %s→%s in %v (up to %d events waited for on the source, %d held on the target)",
		id, src.Shard.Name, dst.Shard.Name, took.Round(time.Millisecond), most.Undelivered, most.Held)}
}

// watchMove polls the status of move id until ctx ends and returns the
// most events it saw waited for on the source and held on the target.
func watchMove(ctx context.Context, id string, from, to move.Endpoint) (most move.Status) {
	for ctx.Err() == nil {
		if st, err := move.Get(ctx, id, from, to); err == nil {
			most.Undelivered = max(most.Undelivered, st.Undelivered)
			most.Held = max(most.Held, st.Held)
		}
		pause(ctx, 10*time.Millisecond)
	}
	return most
}
