package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/producer"
)

// listenGate is a pgx tracer on a relay's connections that keeps its
// listener from listening again while the gate is closed: a LISTEN statement
// waits at the gate. With the listener's connection terminated and the gate
// closed, every notification is lost and only the poll can find new rows.
type listenGate struct {
	gate atomic.Pointer[chan struct{}] // nil: open
	// waiting is signalled each time a LISTEN stops at the closed gate.
	waiting chan struct{}
}

func newListenGate() *listenGate { return &listenGate{waiting: make(chan struct{}, 1)} }

func (g *listenGate) close() {
	ch := make(chan struct{})
	g.gate.Store(&ch)
}

func (g *listenGate) open() {
	if ch := g.gate.Swap(nil); ch != nil {
		close(*ch)
	}
}

func (g *listenGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if ch := g.gate.Load(); ch != nil && strings.HasPrefix(data.SQL, "LISTEN ") {
		select {
		case g.waiting <- struct{}{}:
		default:
		}
		select {
		case <-*ch:
		case <-ctx.Done():
		}
	}
	return ctx
}

func (g *listenGate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestScenarioListenerLost terminates the relay's LISTEN connection and
// keeps it from coming back while writes go on, a few times on a seeded
// schedule. Every event written while the listener is down must be
// consumed before the listener comes back: its notification is lost, and
// RebalanceInterval is an hour, so only the poll can find its row. A relay
// that only woke on notifications and rebalances would leave those events
// waiting until the test gives up. Commit-to-consume latencies are logged,
// not asserted: on a loaded machine they say nothing about the poll.
func TestScenarioListenerLost(t *testing.T) {
	t.Parallel()
	rng := scenarioRand(t)
	s := newScenario(t, rng, broker(t), 2)
	s.startConsumer()
	cfg := scenarioRelayConfig()
	const poll = 300 * time.Millisecond
	cfg.PollInterval = poll
	cfg.RebalanceInterval = time.Hour
	gate := newListenGate()
	r := s.startRelay("a", cfg, gate)

	var up, down []string // event ids written with the listener up and down
	// write commits n events, one per transaction, at random intervals, and
	// goes on until at least minFor has passed. It returns their ids.
	write := func(into *[]string, n int, minFor time.Duration) []string {
		start, from := time.Now(), len(*into)
		for i := 0; i < n || time.Since(start) < minFor; i++ {
			ids, ok := s.attempt([]producer.Event{s.event(fmt.Sprintf("agg-%02d", rng.IntN(10)))}, false)
			require.True(t, ok, "write failed")
			*into = append(*into, ids...)
			pause(context.Background(), time.Duration(20+rng.IntN(400))*time.Millisecond)
		}
		return (*into)[from:]
	}
	outages := 2 + rng.IntN(2)
	for i := range outages {
		write(&up, 3+rng.IntN(5), 0)
		gate.close()
		n := s.terminateListener(r.app)
		waitClosed(t, gate.waiting, 30*time.Second, "the listener to reconnect and stop at the gate")
		t.Logf("outage %d: terminated %d listener session(s); the listener waits at the gate", i+1, n)
		// Several polls long, so that some events wait for a poll that
		// is not the first after the listener went.
		written := write(&down, 5+rng.IntN(8), 3*poll)
		s.waitConsumed(written, 30*time.Second)
		t.Logf("outage %d: the %d events written meanwhile consumed with the listener still down", i+1, len(written))
		gate.open()
	}
	write(&up, 3, 0)
	s.drain(30 * time.Second)
	s.check()

	report := func(what string, ids []string) {
		lat := s.latencies(ids)
		require.NotEmpty(t, lat)
		slices.Sort(lat)
		t.Logf("listener %s: %d events, commit-to-consume latency min %s, median %s, max %s",
			what, len(lat), lat[0].Round(time.Millisecond), lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	}
	report("up", up)
	report("down", down)
}

// terminateListener ends the LISTEN session of application app and returns
// how many sessions it ended. pg_stat_activity shows an idle session's last
// statement, and the listener's last statement is its LISTEN.
func (s *scenario) terminateListener(app string) int {
	s.t.Helper()
	ctx := context.Background()
	rows, err := s.db.Pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app)
	require.NoError(s.t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(s.t, err)
	require.NotEmpty(s.t, pids, "no LISTEN session of %s", app)
	_, err = s.db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid`, pids)
	require.NoError(s.t, err)
	return len(pids)
}

// latencies returns, for each event id, the time from its commit to its
// first consumption.
func (s *scenario) latencies(ids []string) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Duration
	for _, id := range ids {
		c, ok1 := s.committed[id]
		r, ok2 := s.consumed[id]
		if ok1 && ok2 && !c.IsZero() {
			out = append(out, r.Sub(c))
		}
	}
	return out
}
