package move_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/producer"
)

// world is three shards A, B and C, aggregates that live on A at first,
// one writer per aggregate that writes where the aggregate lives
// (following MovedError, as an application would), and one relay that
// publishes the three shards in turn and records each aggregate's
// sequences in the order they went out.
type world struct {
	t      *testing.T
	sides  map[string]*side
	aggs   []string
	stop   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	wire   map[string][]int64
	last   map[string]int64
	at     map[string]string
	writes map[string]int
}

var shardNames = []string{"A", "B", "C"}

func newWorld(t *testing.T, aggs ...string) *world {
	t.Helper()
	w := &world{t: t, sides: map[string]*side{}, aggs: aggs, stop: make(chan struct{}),
		wire: map[string][]int64{}, last: map[string]int64{}, at: map[string]string{}, writes: map[string]int{}}
	for _, n := range shardNames {
		w.sides[n] = newSide(t, n)
	}
	for _, a := range aggs {
		for range 2 {
			_, err := w.sides["A"].write(t, a)
			require.NoError(t, err)
		}
		w.last[a], w.at[a] = 2, "A"
	}
	for _, a := range aggs {
		w.wg.Add(1)
		go w.writer(a)
	}
	w.wg.Add(1)
	go w.relay()
	t.Cleanup(w.halt)
	return w
}

func (w *world) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

func (w *world) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// write writes one event of aggregate order/id on s and returns its
// sequence.
func write(ctx context.Context, s *side, id string) (int64, error) {
	tx, err := s.db.Pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	out, err := s.w.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: id, EventType: "e", Payload: []byte("{}")})
	if err != nil {
		return 0, err
	}
	return out[0].Seq, tx.Commit(ctx)
}

// writer writes aggregate id's events one after the other where it lives,
// and checks that each continues the sequence.
func (w *world) writer(id string) {
	defer w.wg.Done()
	ctx := context.Background()
	w.mu.Lock()
	at, last := w.at[id], w.last[id]
	w.mu.Unlock()
	for !w.stopped() {
		seq, err := write(ctx, w.sides[at], id)
		var me *producer.MovedError
		if errors.As(err, &me) {
			at = me.To
			// Between close and open neither shard takes it: retry.
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			w.t.Errorf("write %s on %s: %v", id, at, err)
			return
		}
		if seq != last+1 {
			w.t.Errorf("write %s on %s: sequence %d after %d", id, at, seq, last)
			return
		}
		last = seq
		w.mu.Lock()
		w.at[id], w.last[id] = at, last
		w.writes[id]++
		w.mu.Unlock()
	}
}

// publish publishes every due event of shard n in id order, as its relay
// would, and records their sequences on the wire.
func (w *world) publish(n string) error {
	s := w.sides[n]
	rows, err := s.db.Pool.Query(context.Background(), fmt.Sprintf(`
WITH p AS (
    UPDATE %s SET published_at = clock_timestamp()
    WHERE published_at IS NULL AND (attempts = 0 OR next_attempt_at <= now())
    RETURNING id, aggregate_id, aggregate_seq)
SELECT aggregate_id, aggregate_seq FROM p ORDER BY id`, s.db.Table("events")))
	if err != nil {
		return err
	}
	defer rows.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	for rows.Next() {
		var id string
		var seq int64
		if err := rows.Scan(&id, &seq); err != nil {
			return err
		}
		w.wire[id] = append(w.wire[id], seq)
	}
	return rows.Err()
}

func (w *world) relay() {
	defer w.wg.Done()
	for !w.stopped() {
		for _, n := range shardNames {
			if err := w.publish(n); err != nil {
				w.t.Errorf("publish %s: %v", n, err)
				return
			}
		}
		select {
		case <-w.stop:
		case <-time.After(time.Millisecond):
		}
	}
}

func (w *world) ep(n string) move.Endpoint { return w.sides[n].ep }

// run runs a move of aggregates ids from shard from to shard to.
func (w *world) run(from, to, id string, ids []string, pause func(int)) (string, error) {
	aggs := make([]move.Aggregate, len(ids))
	for i, a := range ids {
		aggs[i] = move.Aggregate{Type: "order", ID: a}
	}
	c := &move.Config{ID: id, PollInterval: time.Millisecond, Logger: quiet, AllowNew: true}
	if pause != nil {
		c = move.PauseAt(c, pause)
	}
	return move.Run(context.Background(), w.ep(from), w.ep(to), aggs, c)
}

// runStopped runs a move that stops after step, as a crash there would.
func (w *world) runStopped(from, to, id string, ids []string, step int) (string, error) {
	aggs := make([]move.Aggregate, len(ids))
	for i, a := range ids {
		aggs[i] = move.Aggregate{Type: "order", ID: a}
	}
	c := move.StopAfter(&move.Config{ID: id, PollInterval: time.Millisecond, Logger: quiet, AllowNew: true}, step)
	return move.Run(context.Background(), w.ep(from), w.ep(to), aggs, c)
}

// resume resumes move id from shard from to shard to.
func (w *world) resume(from, to, id string, pause func(int)) error {
	c := &move.Config{PollInterval: time.Millisecond, Logger: quiet, AllowNew: true}
	if pause != nil {
		c = move.PauseAt(c, pause)
	}
	return move.Resume(context.Background(), id, w.ep(from), w.ep(to), c)
}

// ended checks that move id from shard from to shard to is finished,
// rolled back, or never recorded, and returns its state ("" when never
// recorded).
func (w *world) ended(from, to, id string) move.State {
	w.t.Helper()
	st, err := move.Get(context.Background(), id, w.ep(from), w.ep(to))
	if errors.Is(err, move.ErrUnknownMove) {
		return ""
	}
	require.NoError(w.t, err)
	require.Contains(w.t, []move.State{move.Done, move.RolledBack}, st.State, "move %s from %s to %s is left half-done", id, from, to)
	return st.State
}

// finish lets every writer write a few more events, stops the writers and
// the relay, publishes what is left and checks the invariants: each
// aggregate lives on exactly one shard, the one its writer last wrote
// on, and its sequences went out as 1, 2, 3... with every event written
// among them.
func (w *world) finish() {
	w.t.Helper()
	w.mu.Lock()
	before := map[string]int{}
	for _, a := range w.aggs {
		before[a] = w.writes[a]
	}
	w.mu.Unlock()
	eventually.True(w.t, 30*time.Second, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, a := range w.aggs {
			if w.writes[a] < before[a]+3 {
				return false
			}
		}
		return true
	}, "every aggregate takes writes after the moves")
	w.halt()
	require.False(w.t, w.t.Failed(), "a writer or the relay failed")
	for _, n := range shardNames {
		require.NoError(w.t, w.publish(n))
	}
	ctx := context.Background()
	for _, a := range w.aggs {
		var events int64
		live := []string{}
		for _, n := range shardNames {
			s := w.sides[n]
			var c int64
			require.NoError(w.t, s.db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE aggregate_id = $1`, s.db.Table("events")), a).Scan(&c))
			events += c
			var movedTo, arriving *string
			err := s.db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT moved_to, arriving_from FROM %s WHERE aggregate_id = $1`, s.db.Table("sequences")), a).Scan(&movedTo, &arriving)
			if err != nil {
				continue // no row: the shard never saw it
			}
			require.Nil(w.t, arriving, "aggregate %s still arriving on %s", a, n)
			if movedTo == nil {
				live = append(live, n)
			}
		}
		require.Equal(w.t, []string{w.at[a]}, live, "aggregate %s lives on exactly one shard, where it was last written", a)
		wire := w.wire[a]
		require.Len(w.t, wire, int(w.last[a]), "aggregate %s: every event written is published (nothing held): %v", a, wire)
		require.Equal(w.t, w.last[a], events, "aggregate %s: one event per sequence across the shards", a)
		for i, seq := range wire {
			require.Equal(w.t, int64(i+1), seq, "aggregate %s on the wire: no gap, reuse or reorder: %v", a, wire)
		}
	}
}

// gate holds a mover at one step until released.
type gate struct {
	step    int
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate(step int) *gate {
	return &gate{step: step, reached: make(chan struct{}), release: make(chan struct{})}
}

func (g *gate) pause(step int) {
	if step != g.step {
		return
	}
	g.once.Do(func() { close(g.reached) })
	<-g.release
}

// wait waits until the mover reached the gate, or returned (err on done).
func (g *gate) wait(t *testing.T, done <-chan result) {
	t.Helper()
	select {
	case <-g.reached:
	case r := <-done:
		t.Fatalf("the mover returned before reaching step %d: %v", g.step, r.err)
	case <-time.After(30 * time.Second):
		t.Fatalf("the mover did not reach step %d", g.step)
	}
}

func (g *gate) open() { close(g.release) }

type result struct {
	id  string
	err error
}

// goRun starts w.run in a goroutine.
func (w *world) goRun(from, to, id string, ids []string, pause func(int)) <-chan result {
	c := make(chan result, 1)
	go func() {
		id, err := w.run(from, to, id, ids, pause)
		c <- result{id, err}
	}()
	return c
}

// goResume starts w.resume in a goroutine.
func (w *world) goResume(from, to, id string, pause func(int)) <-chan result {
	c := make(chan result, 1)
	go func() { c <- result{id, w.resume(from, to, id, pause)} }()
	return c
}

func get(t *testing.T, c <-chan result) result {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("a move did not return")
		return result{}
	}
}

// bothSucceed waits until the movers r1 and r2 are held at their gates g1
// and g2, lets both go at once, and requires both to succeed.
func bothSucceed(t *testing.T, g1 *gate, r1 <-chan result, g2 *gate, r2 <-chan result) {
	t.Helper()
	g1.wait(t, r1)
	g2.wait(t, r2)
	g1.open()
	g2.open()
	require.NoError(t, get(t, r1).err)
	require.NoError(t, get(t, r2).err)
}
