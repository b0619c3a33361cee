package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/d419a114/outbox/integration/history"
	"github.com/d419a114/outbox/producer"
)

// TestScenarioVisibilityGap holds writer transactions open for seconds
// after they drew their ids, while short transactions draw higher ids,
// commit and get delivered. Each long transaction commits only once the
// relay has delivered an event with a higher id than its own, so every
// one of them opens a gap a relay claiming "ids above the last one seen"
// would skip forever. Nothing may be lost.
func TestScenarioVisibilityGap(t *testing.T) {
	t.Parallel()
	rng := scenarioRand(t)
	s := newScenario(t, rng, broker(t), 4)
	s.startConsumer()
	s.startRelay("a", scenarioRelayConfig(), nil)
	stopWriters := s.startWriters(writeLoad{Writers: 3, Aggregates: 30, MaxPerTx: 3, Rollback: 0.2, MaxPause: 10 * time.Millisecond, Limit: 20000})

	type long struct {
		after    time.Duration // start this long into the load
		hold     time.Duration
		rollback bool
		events   int
	}
	var plan []long
	for range 4 + rng.IntN(3) {
		plan = append(plan, long{after: time.Duration(rng.IntN(1500)) * time.Millisecond, hold: time.Duration(1000+rng.IntN(2000)) * time.Millisecond, rollback: rng.IntN(4) == 0, events: 1 + rng.IntN(3)})
	}
	var wg sync.WaitGroup
	for i, l := range plan {
		wg.Go(func() {
			pause(context.Background(), l.after)
			s.longTransaction(fmt.Sprintf("slow-%d", i), l.events, l.hold, l.rollback)
		})
	}
	wg.Wait()
	stopWriters()
	s.drain(60 * time.Second)
	s.check()
}

// longTransaction writes events of aggregate agg in a transaction, waits
// until an event with a higher id was delivered, holds the transaction
// open for at least hold, and commits it (or rolls it back).
func (s *scenario) longTransaction(agg string, events int, hold time.Duration, rollback bool) {
	ctx := context.Background()
	start := time.Now()
	tx, err := s.db.Pool.Begin(ctx)
	if !assertNoError(s.t, err) {
		return
	}
	defer func() { _ = tx.Rollback(ctx) }()
	evs := make([]producer.Event, events)
	for i := range evs {
		evs[i] = s.event(agg)
	}
	written, err := s.writer.Write(ctx, tx, evs...)
	if !assertNoError(s.t, err) {
		return
	}
	low := written[0].ID
	deadline := time.Now().Add(60 * time.Second)
	for {
		var overtaken bool
		err := s.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.db.Table("events")+` WHERE id > $1 AND published_at IS NOT NULL)`, low).Scan(&overtaken)
		if !assertNoError(s.t, err) {
			return
		}
		if overtaken && time.Since(start) >= hold {
			break
		}
		if time.Now().After(deadline) {
			s.t.Errorf("no event with an id above %d was delivered within 60s", low)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rollback {
		_ = tx.Rollback(ctx)
	} else {
		err = tx.Commit(ctx)
		if !assertNoError(s.t, err) {
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, w := range written {
		if !rollback {
			s.committed[w.EventID] = time.Now()
		}
		s.rec.Write(history.Write{EventID: w.EventID, Aggregate: aggregateOf(evs[i]), Seq: w.Seq, Committed: !rollback})
	}
	s.t.Logf("%s: ids %d..%d held open %s, overtaken by delivered higher ids, then %s",
		agg, low, written[len(written)-1].ID, time.Since(start).Round(time.Millisecond), map[bool]string{true: "rolled back", false: "committed"}[rollback])
}

// assertNoError reports err as a test error, for goroutines other than the
// test's own, where require cannot stop the test.
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
