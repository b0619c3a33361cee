package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
)

// BenchmarkRouting applies the same records with the same handler (one
// INSERT into the transaction's own schema) in three ways, in one run, and
// reports records/s for each and the ratios to the first:
//
//   - single: a Processor over one database, no Config.Route (the
//     baseline);
//   - route1: Config.Route with one target, every record routed to it (what
//     routing itself costs);
//   - route2: Config.Route with two targets, the aggregates split between
//     them, so that a batch is two transactions, one per target.
//
// Every target is a schema of its own on the one test server, with a pool
// of its own. It runs per record (Process) and per batch of 100
// (ProcessBatch), the modes taking turns every 100 records, which goes first rotating, so that a slow
// moment of the machine falls on all of them alike. Records are built in
// memory: the figures are the database path alone.
//
//	go test -run '^$' -bench Routing -benchtime 5x -count 3 ./consumer
func BenchmarkRouting(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			benchmarkRouting(b, batch)
		})
	}
}

func benchmarkRouting(b *testing.B, batch int) {
	const perRound, aggs = 1000, 50
	ctx := context.Background()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO bench_effects (key, aggregate, seq) VALUES ($1, $2, $3)`, m.IdempotencyKey, m.AggregateID, m.Seq)
		return err
	})
	// owner splits the aggregates between targets a and b by parity.
	owner := map[string]string{}
	for i := range aggs {
		owner[fmt.Sprintf("agg-%d", i)] = []string{"a", "b"}[i%2]
	}
	route := func(targets ...consumer.Target) *consumer.Config {
		return &consumer.Config{Logger: quietLogger, BatchSize: batch, Route: &consumer.Route{
			Targets: targets,
			Owner: func(_, id string) (string, error) {
				if len(targets) == 1 {
					return targets[0].Name, nil
				}
				return owner[id], nil
			},
		}}
	}
	single := routeBenchTarget(b, "single")
	a1, b1, b2 := routeBenchTarget(b, "a"), routeBenchTarget(b, "a"), routeBenchTarget(b, "b")
	procs := make([]*consumer.Processor, 3)
	var err error
	procs[0], err = consumer.Handle(single.DB, "bench", h, &consumer.Config{Schema: single.Schema, Logger: quietLogger, BatchSize: batch})
	require.NoError(b, err)
	procs[1], err = consumer.Handle(nil, "bench", h, route(a1))
	require.NoError(b, err)
	procs[2], err = consumer.Handle(nil, "bench", h, route(b1, b2))
	require.NoError(b, err)

	round := 0
	records := func() []*kgo.Record {
		round++
		rs := make([]*kgo.Record, perRound)
		for i := range rs {
			agg := fmt.Sprintf("agg-%d", i%aggs)
			seq := int64((round-1)*perRound/aggs + i/aggs + 1)
			rs[i] = rec(agg, seq, fmt.Sprintf("%s-%d", agg, seq))
			rs[i].Topic, rs[i].Offset = "bench", int64((round-1)*perRound+i)
		}
		return rs
	}
	run := func(p *consumer.Processor, rs []*kgo.Record) {
		for i := 0; i < len(rs); i += batch {
			if batch == 1 {
				res, err := p.Process(ctx, rs[i])
				require.NoError(b, err)
				require.Equal(b, consumer.Applied, res.Outcome)
				continue
			}
			res, err := p.ProcessBatch(ctx, rs[i:i+batch])
			require.NoError(b, err)
			require.Len(b, res, batch)
			require.Equal(b, consumer.Applied, res[batch-1].Outcome)
		}
	}
	var elapsed [3]time.Duration
	b.ResetTimer()
	for b.Loop() {
		// Every mode applies the same records, each in its own schemas.
		rs := records()
		for c := 0; c < perRound; c += 100 {
			// Which mode goes first rotates.
			for k := range procs {
				i := (c/100 + k) % len(procs)
				start := time.Now()
				run(procs[i], rs[c:c+100])
				elapsed[i] += time.Since(start)
			}
		}
	}
	b.StopTimer()
	rate := func(d time.Duration) float64 { return float64(b.N*perRound) / d.Seconds() }
	b.ReportMetric(rate(elapsed[0]), "single_rec/s")
	b.ReportMetric(rate(elapsed[1]), "route1_rec/s")
	b.ReportMetric(rate(elapsed[2]), "route2_rec/s")
	b.ReportMetric(rate(elapsed[1])/rate(elapsed[0]), "route1/single")
	b.ReportMetric(rate(elapsed[2])/rate(elapsed[0]), "route2/single")
	b.ReportMetric(0, "ns/op")
}

// routeBenchTarget makes a target named name: a schema of its own with a
// table bench_effects, and a pool whose search_path is that schema, so
// that the handler's unqualified INSERT writes in the target whose
// transaction it was given.
func routeBenchTarget(b *testing.B, name string) consumer.Target {
	b.Helper()
	ctx := context.Background()
	db := pgtest.New(b, nil)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Table("bench_effects")+` (key text NOT NULL, aggregate text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(b, err)
	cfg, err := pgxpool.ParseConfig(db.Server.URL)
	require.NoError(b, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	return consumer.Target{Name: name, DB: pool, Schema: db.Schema}
}
