package integration

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgserver"
	"github.com/d419a114/outbox/internal/pgtest"
)

// TestScenarioPostgresRestart crashes and restarts the PostgreSQL server
// (immediate shutdown: no checkpoint, every session cut) once or twice
// under load, with two relays running. Commits that fail are resolved
// afterwards by looking their events up. Nothing committed may be lost.
//
// The server is a cluster of the test's own (pgtest.Own), whatever
// TEST_DATABASE_URL says: a server given by URL cannot be restarted from
// here, and the shared one serves the other tests. It is not parallel: two
// relays, four writers and a crash under a loaded machine are enough.
func TestScenarioPostgresRestart(t *testing.T) {
	rng := scenarioRand(t)
	s := newScenarioOn(t, rng, broker(t), 4, pgtest.Own(t, pgserver.Config{}))
	s.startConsumer()
	cfg := scenarioRelayConfig()
	s.startRelay("a", cfg, nil)
	s.startRelay("b", cfg, nil)
	stopWriters := s.startWriters(writeLoad{Writers: 4, Aggregates: 60, MaxPerTx: 4, Rollback: 0.15, MaxPause: 5 * time.Millisecond, Limit: 30000})

	restarts := 1 + rng.IntN(2)
	for i := range restarts {
		s.waitProgress(100 + rng.IntN(400))
		start := time.Now()
		require.NoError(t, s.db.Server.Restart())
		s.db.Pool.Reset() // its connections died with the server
		t.Logf("restart %d of %d: PostgreSQL crashed and back in %s", i+1, restarts, time.Since(start).Round(time.Millisecond))
	}
	s.waitProgress(200 + rng.IntN(300))
	stopWriters()
	s.drain(90 * time.Second)
	s.check()
}

// TestScenarioBrokerRestart restarts the Kafka cluster on its data under
// load, once or twice: kfake kept down for a seeded while, or the real
// broker through KAFKA_RESTART. While the cluster is down, one relay shuts
// down with records still buffered in its client (the client is closed
// first, failing them); a new relay replaces it after the restart. Publishes
// that fail must be retried, not lost, and the restart must not reorder.
func TestScenarioBrokerRestart(t *testing.T) {
	b := restartableBroker(t)
	if b.Fake != nil {
		t.Parallel() // a private kfake; a real broker is shared, see restartableBroker
	}
	rng := scenarioRand(t)
	s := newScenario(t, rng, b.Broker, 4)
	s.startConsumer()
	cfg := scenarioRelayConfig()
	a := s.startRelay("a", cfg, nil)
	s.startRelay("b", cfg, nil)
	stopWriters := s.startWriters(writeLoad{Writers: 4, Aggregates: 60, MaxPerTx: 4, Rollback: 0.15, MaxPause: 5 * time.Millisecond, Limit: 30000})

	restarts := 1 + rng.IntN(2)
	for i := range restarts {
		s.waitProgress(100 + rng.IntN(400))
		down := time.Duration(1000+rng.IntN(1500)) * time.Millisecond
		var during func()
		if i == 0 {
			during = func() {
				a.closeClient()
				a.stop()
			}
		}
		b.restartWith(t, down, during)
		t.Logf("restart %d of %d done (kfake: kept down for at least %s); relay a shut down during the first", i+1, restarts, down)
		if i == 0 {
			s.startRelay("c", cfg, nil)
		}
	}
	s.waitProgress(200 + rng.IntN(300))
	stopWriters()
	s.drain(90 * time.Second)
	s.check()
}

// waitProgress waits until n more events than now were consumed.
func (s *scenario) waitProgress(n int) {
	s.t.Helper()
	count := func() int {
		keys := s.committedKeys()
		return len(keys) - s.missing(keys)
	}
	want := count() + n
	deadline := time.Now().Add(90 * time.Second)
	for count() < want {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out after 90s waiting for %d events consumed; %d were\n%s", want, count(), s.rec.Check())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
