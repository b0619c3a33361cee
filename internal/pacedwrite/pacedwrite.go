// Package pacedwrite drives the latency benchmarks: it writes events at a
// steady rate, one or several per transaction, and turns commit and
// arrival times into percentiles.
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
	return RunGrouped(ctx, tb, pool, w, rate, 1, total, arrived)
}

// RunGrouped is Run with perTx events written in each transaction: rate
// events per second in rate/perTx transactions per second, so that rates
// above what one commit per event allows on a small machine can be
// reached. Every event of a transaction has that transaction's commit
// time.
func RunGrouped(ctx context.Context, tb testing.TB, pool *pgxpool.Pool, w *producer.Writer, rate, perTx, total int, arrived func() int) map[string]time.Time {
	write(ctx, tb, pool, w, rate, perTx, rate)
	eventually.True(tb, 60*time.Second, func() bool { return arrived() >= rate }, "the warm-up's events to arrive")
	return write(ctx, tb, pool, w, rate, perTx, total)
}

// write writes total events through w, rate per second, perTx per
// transaction, and returns when each one's commit returned, by event id.
func write(ctx context.Context, tb testing.TB, pool *pgxpool.Pool, w *producer.Writer, rate, perTx, total int) map[string]time.Time {
	var (
		mu        sync.Mutex
		committed = make(map[string]time.Time, total)
		wg        sync.WaitGroup
	)
	tick := time.NewTicker(time.Second * time.Duration(perTx) / time.Duration(rate))
	defer tick.Stop()
	for first := 0; first < total; first += perTx {
		<-tick.C
		events := make([]producer.Event, 0, perTx)
		for i := first; i < min(first+perTx, total); i++ {
			events = append(events, producer.Event{AggregateType: "account", AggregateID: strconv.Itoa(i % 500), EventType: "e", Payload: []byte("x")})
		}
		wg.Go(func() {
			tx, err := pool.Begin(ctx)
			if err != nil {
				tb.Error(err)
				return
			}
			defer func() { _ = tx.Rollback(ctx) }()
			written, err := w.Write(ctx, tx, events...)
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
			for _, e := range written {
				committed[e.EventID] = at
			}
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
