package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestScenarioRelaysComeAndGo runs many writers over many aggregates while
// relay instances start, stop cleanly and die (sessions terminated, then
// cancelled), between one and three at a time, on a seeded schedule. The
// consumer must see every aggregate's sequence numbers first appear
// densely and in order: buckets changing hands may never let two instances
// publish one aggregate at once.
func TestScenarioRelaysComeAndGo(t *testing.T) {
	t.Parallel()
	rng := scenarioRand(t)
	s := newScenario(t, rng, broker(t), 6)
	s.startConsumer()
	stopWriters := s.startWriters(writeLoad{Writers: 8, Aggregates: 120, MaxPerTx: 5, Rollback: 0.1, MaxPause: 5 * time.Millisecond, Limit: 30000})

	cfg := scenarioRelayConfig()
	var running []*relay
	started := 0
	start := func() {
		started++
		running = append(running, s.startRelay(fmt.Sprintf("r%d", started), cfg, nil))
	}
	start()
	var log []string
	for step := range 14 {
		switch {
		case len(running) < 3 && (len(running) <= 1 || rng.IntN(2) == 0):
			start()
			log = append(log, "start "+running[len(running)-1].name)
		default:
			i := rng.IntN(len(running))
			r := running[i]
			running = append(running[:i], running[i+1:]...)
			if rng.IntN(2) == 0 {
				r.stop()
				log = append(log, "stop "+r.name)
			} else {
				n := s.terminate(r.app)
				r.stop()
				log = append(log, fmt.Sprintf("kill %s (%d sessions)", r.name, n))
			}
			if len(running) == 0 {
				start()
				log = append(log, "start "+running[len(running)-1].name)
			}
		}
		// Let the new arrangement deliver something before the next change.
		before := len(s.committedKeys()) - s.missing(s.committedKeys())
		want := before + 100 + rng.IntN(300)
		waitUntil(t, 60*time.Second, fmt.Sprintf("step %d: %d events consumed", step, want), func() bool {
			keys := s.committedKeys()
			return len(keys)-s.missing(keys) >= want
		})
	}
	t.Logf("schedule: %v", log)
	stopWriters()
	s.drain(60 * time.Second)
	for _, r := range running {
		r.stop()
	}
	rep := s.check()
	require.Greater(t, rep.Committed, 1000, "too little traffic to say anything")
}
