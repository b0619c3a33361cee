package move_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/producer"
)

// BenchmarkMove times move.Run, from its start until it returns: the
// target's held events of the moved aggregates are released (step 4) and
// the move recorded done on the source. The window in which the target
// holds the aggregates' writes (step 2 to step 4) lies within it. Source
// and target are schemas of the one test server; a real relay runs on the
// source, publishing to kfake. Each move takes fresh aggregates, each
// with three events written on the source just before. Two modes take
// turns, which goes first alternating:
//
//   - delivered (the baseline): Run starts once the relay published the
//     aggregates' events, so the drain (step 3) finds nothing to wait for;
//   - in-flight: Run starts right after the events' commit, so the drain
//     waits for the relay to publish them, looking every PollInterval.
//
// It runs for 1 and 100 aggregates per move, at the default PollInterval
// (100ms) and at 10ms, and reports milliseconds per move for each mode
// and their ratio.
//
//	go test -run '^$' -bench Move -benchtime 20x -count 3 ./move
func BenchmarkMove(b *testing.B) {
	for _, aggs := range []int{1, 100} {
		for _, poll := range []time.Duration{0, 10 * time.Millisecond} {
			name := "poll=default"
			if poll > 0 {
				name = fmt.Sprintf("poll=%s", poll)
			}
			b.Run(fmt.Sprintf("aggregates=%d/%s", aggs, name), func(b *testing.B) {
				benchmarkMove(b, aggs, &move.Config{PollInterval: poll, Logger: quiet, AllowNew: true})
			})
		}
	}
}

func benchmarkMove(b *testing.B, aggs int, cfg *move.Config) {
	ctx := context.Background()
	src, dst := newSide(b, "source"), newSide(b, "target")
	broker := kafkatest.New(b)
	relay, err := producer.NewRelay(src.db.Pool, broker.Client(b), &producer.RelayConfig{Schema: src.db.Schema, Topic: broker.Topic(b, 8), Logger: quiet})
	require.NoError(b, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	b.Cleanup(func() { stop(); require.NoError(b, <-done) })

	moved := 0
	// moveOnce writes three events of each of aggs new aggregates on the
	// source, waits for the relay to publish them when delivered, and
	// times the move of them to the target.
	moveOnce := func(delivered bool) time.Duration {
		list := make([]move.Aggregate, aggs)
		var events []producer.Event
		for i := range list {
			moved++
			list[i] = move.Aggregate{Type: "order", ID: fmt.Sprintf("o-%d", moved)}
			for range 3 {
				events = append(events, producer.Event{AggregateType: "order", AggregateID: list[i].ID, EventType: "e", Payload: []byte("{}")})
			}
		}
		tx, err := src.db.Pool.Begin(ctx)
		require.NoError(b, err)
		_, err = src.w.Write(ctx, tx, events...)
		require.NoError(b, err)
		require.NoError(b, tx.Commit(ctx))
		if delivered {
			eventually.True(b, time.Minute, func() bool { return src.undelivered(b) == 0 }, "the relay to publish the source's events")
		}
		start := time.Now()
		_, err = move.Run(ctx, src.ep, dst.ep, list, cfg)
		took := time.Since(start)
		require.NoError(b, err)
		return took
	}
	var delivered, inFlight time.Duration
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			delivered += moveOnce(true)
			inFlight += moveOnce(false)
		} else {
			inFlight += moveOnce(false)
			delivered += moveOnce(true)
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(delivered), "delivered-ms/move")
	b.ReportMetric(ms(inFlight), "in-flight-ms/move")
	b.ReportMetric(float64(inFlight)/float64(delivered), "in-flight/delivered")
	b.ReportMetric(0, "ns/op")
}

// undelivered counts the side's events not yet published.
func (s *side) undelivered(tb testing.TB) int {
	tb.Helper()
	var n int
	require.NoError(tb, s.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+s.db.Table("events")+` WHERE published_at IS NULL`).Scan(&n))
	return n
}
