// Package pacedwrite drives the latency benchmarks: it writes one event per
// transaction at a steady rate and turns commit and arrival times into
// percentiles.
package pacedwrite

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/producer"
)

// Run writes a second's worth of events through w at rate per second, waits
// until arrived (the caller's count of events seen at the far end) reaches
// them, then writes total more at the same rate and returns when each of
// those one's commit returned, by event id. Each event is written in a
// transaction of its own on pool. The warm-up is left out of the result:
// connections opening, statements being prepared and a consumer joining
// its group happen once per run, and a backlog they leave would otherwise
// be the measured events' tail. Failures are reported to tb.
func Run(ctx context.Context, tb testing.TB, pool *pgxpool.Pool, w *producer.Writer, rate, total int, arrived func() int) map[string]time.Time {
	write(ctx, tb, pool, w, rate, rate)
	eventually.True(tb, 60*time.Second, func() bool { return arrived() >= rate }, "the warm-up's events to arrive")
	return write(ctx, tb, pool, w, rate, total)
}

// write writes total events through w, rate per second, and returns when
// each one's commit returned, by event id.
func write(ctx context.Context, tb testing.TB, pool *pgxpool.Pool, w *producer.Writer, rate, total int) map[string]time.Time {
	var (
		mu        sync.Mutex
		committed = make(map[string]time.Time, total)
		wg        sync.WaitGroup
	)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range total {
		<-tick.C
		wg.Go(func() {
			tx, err := pool.Begin(ctx)
			if err != nil {
				tb.Error(err)
				return
			}
			defer func() { _ = tx.Rollback(ctx) }()
			written, err := w.Write(ctx, tx, producer.Event{AggregateType: "account", AggregateID: strconv.Itoa(i % 500), EventType: "e", Payload: []byte("x")})
			if err != nil {
				tb.Error(err)
				return
			}
			if err := tx.Commit(ctx); err != nil {
				tb.Error(err)
				return
			}
			at := time.Now()
			mu.Lock()
			committed[written[0].EventID] = at
			mu.Unlock()
		})
	}
	wg.Wait()
	return committed
}

// Percentiles returns the median and 99th percentile of arrived[id] -
// committed[id] over the events in both maps.
func Percentiles(committed, arrived map[string]time.Time) (p50, p99 time.Duration) {
	latencies := make([]time.Duration, 0, len(arrived))
	for id, at := range arrived {
		if from, ok := committed[id]; ok {
			latencies = append(latencies, at.Sub(from))
		}
	}
	if len(latencies) == 0 {
		return 0, 0
	}
	slices.Sort(latencies)
	return latencies[len(latencies)/2], latencies[len(latencies)*99/100]
}
