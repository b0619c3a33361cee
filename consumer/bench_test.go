package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
)

// BenchmarkThroughput applies the same handler (one INSERT) to the same
// kind of records in several ways, in one run, and reports records/s for
// each and the ratios the SDK promises:
//
//   - bare: the handler in a bare transaction per record, no dedupe, no
//     ordering (the baseline);
//   - single: consumer.Process, one transaction per record with the key
//     claim and the position move (target: at least 0.75x bare);
//   - noseq: the same for records without a sequence (dedupe alone);
//   - savepoints: 100 records per transaction with a savepoint per record
//     around claim + move + handler, hand-written (what batch mode must not
//     do);
//   - bare batch: the handler for 100 records in one bare transaction (the
//     ceiling for batch mode: the handler's own statement per record);
//   - batch: consumer.ProcessBatch with 100 records per transaction (target:
//     at least 3x single);
//   - bare multi-row batch: the 100 records' effects with one multi-row
//     INSERT in one bare transaction (the ceiling for a BatchHandler);
//   - batch handler: consumer.ProcessBatch with 100 records per transaction
//     and a BatchHandler that does the same multi-row INSERT.
//
// Records are built in memory, so the figures are the database path alone.
func BenchmarkThroughput(b *testing.B) {
	const perRound = 1000
	ctx := context.Background()
	db := pgtest.New(b, nil)
	effects := db.Table("bench_effects")
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+effects+` (key text NOT NULL, aggregate text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(b, err)
	insert := `INSERT INTO ` + effects + ` (key, aggregate, seq) VALUES ($1, $2, $3)`
	insertMany := `INSERT INTO ` + effects + ` (key, aggregate, seq) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, insert, m.IdempotencyKey, m.AggregateID, m.Seq)
		return err
	})
	cfg := &consumer.Config{Schema: db.Schema, Logger: quietLogger}
	single, err := consumer.Handle(db.Pool, "bench-single", h, cfg)
	require.NoError(b, err)
	batch, err := consumer.Handle(db.Pool, "bench-batch", h, cfg)
	require.NoError(b, err)
	batchHandler, err := consumer.Handle(db.Pool, "bench-bh", multiRow{Handler: h, insertMany: insertMany}, cfg)
	require.NoError(b, err)
	claim := `INSERT INTO ` + db.Table("processed_keys") + ` (consumer, key) VALUES ('bench-sp', $1) ON CONFLICT DO NOTHING`
	move := `INSERT INTO ` + db.Table("positions") + ` AS p (consumer, aggregate_type, aggregate_id, last_seq) VALUES ('bench-sp', 'order', $1, $2)
ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE SET last_seq = EXCLUDED.last_seq WHERE p.last_seq = EXCLUDED.last_seq - 1`

	round := 0
	records := func() []*kgo.Record {
		round++
		rs := make([]*kgo.Record, perRound)
		for i := range rs {
			agg := fmt.Sprintf("agg-%d", i%50)
			seq := int64((round-1)*perRound/50 + i/50 + 1)
			rs[i] = rec(agg, seq, fmt.Sprintf("%s-%d", agg, seq))
			rs[i].Topic, rs[i].Offset = "bench", int64((round-1)*perRound+i)
		}
		return rs
	}
	var elapsed [8]time.Duration
	noseq, err := consumer.Handle(db.Pool, "bench-noseq", h, cfg)
	require.NoError(b, err)
	modes := []func(rs []*kgo.Record){
		func(rs []*kgo.Record) { // bare
			for _, r := range rs {
				require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, insert, string(r.Key), string(r.Key), r.Offset)
					return err
				}))
			}
		},
		func(rs []*kgo.Record) { // single
			for _, r := range rs {
				_, err := single.Process(ctx, r)
				require.NoError(b, err)
			}
		},
		func(rs []*kgo.Record) { // savepoints
			for i := 0; i < len(rs); i += 100 {
				require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					for j, r := range rs[i : i+100] {
						err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
							if _, err := sp.Exec(ctx, claim, fmt.Sprint(r.Offset)); err != nil {
								return err
							}
							if _, err := sp.Exec(ctx, move, string(r.Key), int64(round*perRound+i+j)); err != nil {
								return err
							}
							_, err := sp.Exec(ctx, insert, string(r.Key), string(r.Key), r.Offset)
							return err
						})
						if err != nil {
							return err
						}
					}
					return nil
				}))
			}
		},
		func(rs []*kgo.Record) { // noseq
			for _, r := range rs {
				r.Headers = r.Headers[:4]
				_, err := noseq.Process(ctx, r)
				require.NoError(b, err)
			}
		},
		func(rs []*kgo.Record) { // bare batch
			for i := 0; i < len(rs); i += 100 {
				require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					for _, r := range rs[i : i+100] {
						if _, err := tx.Exec(ctx, insert, string(r.Key), string(r.Key), r.Offset); err != nil {
							return err
						}
					}
					return nil
				}))
			}
		},
		func(rs []*kgo.Record) { // batch
			for i := 0; i < len(rs); i += 100 {
				res, err := batch.ProcessBatch(ctx, rs[i:i+100])
				require.NoError(b, err)
				require.Equal(b, consumer.Applied, res[99].Outcome)
			}
		},
		func(rs []*kgo.Record) { // bare multi-row batch
			for i := 0; i < len(rs); i += 100 {
				keys, aggs, seqs := make([]string, 100), make([]string, 100), make([]int64, 100)
				for j, r := range rs[i : i+100] {
					keys[j], aggs[j], seqs[j] = string(r.Key), string(r.Key), r.Offset
				}
				require.NoError(b, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, insertMany, keys, aggs, seqs)
					return err
				}))
			}
		},
		func(rs []*kgo.Record) { // batch handler
			for i := 0; i < len(rs); i += 100 {
				res, err := batchHandler.ProcessBatch(ctx, rs[i:i+100])
				require.NoError(b, err)
				require.Equal(b, consumer.Applied, res[99].Outcome)
			}
		},
	}
	b.ResetTimer()
	for b.Loop() {
		// Every mode gets the same records, and the modes take turns every
		// 100 records, so that a slow moment of the machine (a checkpoint,
		// autovacuum) falls on all of them alike.
		rs := make([][]*kgo.Record, len(modes))
		for i := range modes {
			rs[i] = records()
			round--
		}
		round++
		for c := 0; c < perRound; c += 100 {
			for i, run := range modes {
				start := time.Now()
				run(rs[i][c : c+100])
				elapsed[i] += time.Since(start)
			}
		}
	}
	b.StopTimer()
	rate := func(d time.Duration) float64 { return float64(b.N*perRound) / d.Seconds() }
	b.ReportMetric(rate(elapsed[0]), "bare_rec/s")
	b.ReportMetric(rate(elapsed[1]), "single_rec/s")
	b.ReportMetric(rate(elapsed[2]), "savepoint100_rec/s")
	b.ReportMetric(rate(elapsed[4]), "bare_batch100_rec/s")
	b.ReportMetric(rate(elapsed[5]), "batch100_rec/s")
	b.ReportMetric(rate(elapsed[5])/rate(elapsed[4]), "batch/bare_batch")
	b.ReportMetric(rate(elapsed[3])/rate(elapsed[0]), "noseq/bare")
	b.ReportMetric(rate(elapsed[1])/rate(elapsed[0]), "single/bare")
	b.ReportMetric(rate(elapsed[5])/rate(elapsed[1]), "batch/single")
	b.ReportMetric(rate(elapsed[6]), "bare_multirow100_rec/s")
	b.ReportMetric(rate(elapsed[7]), "batch_handler100_rec/s")
	b.ReportMetric(rate(elapsed[7])/rate(elapsed[6]), "batch_handler/bare_multirow")
	b.ReportMetric(rate(elapsed[7])/rate(elapsed[1]), "batch_handler/single")
	b.ReportMetric(rate(elapsed[7])/rate(elapsed[5]), "batch_handler/batch")
	b.ReportMetric(0, "ns/op")
}

// multiRow is the benchmark's handler as a BatchHandler: a batch's effects
// in one INSERT of arrays.
type multiRow struct {
	consumer.Handler
	insertMany string
}

func (h multiRow) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	keys, aggs, seqs := make([]string, len(ms)), make([]string, len(ms)), make([]int64, len(ms))
	for i, m := range ms {
		keys[i], aggs[i], seqs[i] = m.IdempotencyKey, m.AggregateID, m.Seq
	}
	_, err := tx.Exec(ctx, h.insertMany, keys, aggs, seqs)
	return err
}
