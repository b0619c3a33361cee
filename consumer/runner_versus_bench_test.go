package consumer_test

import (
	"context"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
)

// BenchmarkRunnerVersusProcess measures the runner (consumer.New and Run,
// Concurrency 1: one lane and one worker per partition) against the SDK's
// own loop on the same records with the same parallelism: a goroutine per
// partition calling Processor.ProcessBatch (batch mode, up to 100 records
// per transaction, with a BatchHandler) or Processor.Process (one record
// per transaction) on what a poll loop hands it (processLoop). For
// reference it also runs the same goroutines on records read into memory
// before the clock starts (preloaded), which leaves out what consuming
// from Kafka costs on the same cores, and the ideal multi-row loop
// (idealLoop): the same poll loop and goroutines with plain pgx, claiming
// the keys and inserting the effects with one multi-row statement each
// per transaction and keeping no positions. Eight partitions, 10,000 aggregates,
// records pre-produced to kfake, PostgreSQL on the same machine. The modes
// take turns, each on a topic of its own with the same records, in as
// many rounds as there are modes (which goes first rotating, so each mode
// runs once in each place of the order), and the benchmark reports
// each mode's median records/s, the runner's records per transaction and
// how many times its client decoded each record (franz-go refetches what
// it drops of a paused partition), and
// the median, lowest and highest of the rounds' runner/loop ratios, with
// the medians of runner/ideal (with its lowest and highest round),
// loop/ideal, runner/preloaded and loop/preloaded. Every run checks its
// own effects: each record applied once, each aggregate's in sequence
// order. Targets: runner/loop >= 0.9 and runner/ideal >= 0.8 in batch
// mode, runner/loop >= 0.95 single.
//
//	go test -run '^$' -bench RunnerVersusProcess -benchtime 1x ./consumer
func BenchmarkRunnerVersusProcess(b *testing.B) {
	b.Run("batch", func(b *testing.B) { benchVersus(b, 100, 48000) })
	b.Run("single", func(b *testing.B) { benchVersus(b, 1, 8000) })
}

// benchVersus runs the rounds of BenchmarkRunnerVersusProcess with batch
// records per transaction over n records.
func benchVersus(b *testing.B, batch, n int) {
	modes := []string{"loop", "runner", "ideal", "preloaded"}
	rounds := len(modes)
	for b.Loop() {
		rig := newRunnerRig(b, 24)
		spread := byKey(8)
		rates := map[string][]float64{}
		var ratios, perTx, decodes []float64
		for round := range rounds {
			rate := map[string]float64{}
			for turn := range modes {
				mode := modes[(turn+round)%len(modes)]
				r := rig.newRun(b, 8, zipfStream(n, 10000, 0), spread)
				// The labels let a CPU profile of the run be split by mode
				// (go tool pprof -tagfocus mode=runner).
				pprof.Do(context.Background(), pprof.Labels("mode", mode), func(context.Context) {
					switch mode {
					case "loop":
						rate[mode] = r.processLoop(b, batch, n)
					case "runner":
						r.fetched = &fetchCount{buffered: map[int32]map[int64]int{}}
						rate[mode] = r.runner(b, consumer.Config{BatchSize: batch}, batch > 1, n)
						perTx = append(perTx, float64(n)/float64(r.calls.Load()))
						all, _ := r.fetched.totals()
						decodes = append(decodes, float64(all)/float64(n))
					case "ideal":
						rate[mode] = r.idealLoop(b, batch, n)
					case "preloaded":
						rate[mode] = r.preloaded(b, batch, n)
					}
				})
				rates[mode] = append(rates[mode], rate[mode])
			}
			ratios = append(ratios, rate["runner"]/rate["loop"])
			rates["runner/ideal"] = append(rates["runner/ideal"], rate["runner"]/rate["ideal"])
			rates["loop/ideal"] = append(rates["loop/ideal"], rate["loop"]/rate["ideal"])
			rates["runner/preloaded"] = append(rates["runner/preloaded"], rate["runner"]/rate["preloaded"])
			rates["loop/preloaded"] = append(rates["loop/preloaded"], rate["loop"]/rate["preloaded"])
		}
		for _, m := range modes {
			b.ReportMetric(median(rates[m]), m+"-rec/s")
		}
		b.ReportMetric(median(perTx), "runner-rec/tx")
		b.ReportMetric(median(decodes), "runner-decodes/rec")
		b.ReportMetric(median(ratios), "runner/loop")
		b.ReportMetric(slices.Min(ratios), "runner/loop-min")
		b.ReportMetric(slices.Max(ratios), "runner/loop-max")
		b.ReportMetric(median(rates["runner/ideal"]), "runner/ideal")
		b.ReportMetric(slices.Min(rates["runner/ideal"]), "runner/ideal-min")
		b.ReportMetric(slices.Max(rates["runner/ideal"]), "runner/ideal-max")
		b.ReportMetric(median(rates["loop/ideal"]), "loop/ideal")
		b.ReportMetric(median(rates["runner/preloaded"]), "runner/preloaded")
		b.ReportMetric(median(rates["loop/preloaded"]), "loop/preloaded")
	}
}

// median returns the median of xs.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// processLoop is the SDK's own loop at one worker per partition, what a
// user would write around the Processor without the runner (see
// partitionLoop): each partition's goroutine applies what it holds with
// Processor.ProcessBatch, up to batch records at a time with a
// BatchHandler, or Processor.Process one by one.
func (r *benchRun) processLoop(b *testing.B, batch, records int) float64 {
	var h consumer.Handler = r
	if batch > 1 {
		h = batchRun{r}
	}
	p, err := consumer.Handle(r.rig.db.Pool, "svc-"+r.topic, h, &consumer.Config{Schema: r.rig.db.Schema, Logger: quietLogger})
	require.NoError(b, err)
	return r.partitionLoop(b, batch, records, func(recs []*kgo.Record) error {
		if len(recs) == 1 {
			_, err := p.Process(context.Background(), recs[0])
			return err
		}
		_, err := p.ProcessBatch(context.Background(), recs)
		return err
	})
}

// idealLoop is the ideal multi-row loop: partitionLoop's goroutines with
// plain pgx, which do less than the SDK. Each takes up to batch records
// in one transaction: BEGIN, one multi-row INSERT ... ON CONFLICT DO
// NOTHING RETURNING claiming their idempotency keys in a processed-keys
// table of its own, one multi-row INSERT of the effects of the keys it
// claimed (the effects the SDK's handler writes), COMMIT. It keeps no
// aggregate positions (so checks no order: the partition's records are
// applied in offset order, as they come), parks nothing and has no dead
// letters.
func (r *benchRun) idealLoop(b *testing.B, batch, records int) float64 {
	ctx := context.Background()
	keysTable := r.rig.db.Table("keys_" + r.topic[len("test-"):])
	_, err := r.rig.db.Pool.Exec(ctx, `CREATE TABLE `+keysTable+` (key text PRIMARY KEY)`)
	require.NoError(b, err)
	claim := `INSERT INTO ` + keysTable + ` (key) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING RETURNING key`
	insert := `INSERT INTO ` + r.table + ` (key, aggregate, seq) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`
	return r.partitionLoop(b, batch, records, func(recs []*kgo.Record) error {
		keys := make([]string, len(recs))
		for i, rec := range recs {
			keys[i], _ = header(rec, outbox.HeaderEventID)
		}
		tx, err := r.rig.db.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		rows, err := tx.Query(ctx, claim, keys)
		if err != nil {
			return err
		}
		claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		fresh := make(map[string]bool, len(claimed))
		for _, k := range claimed {
			fresh[k] = true
		}
		var ks, aggs []string
		var seqs []int64
		for i, rec := range recs {
			if !fresh[keys[i]] {
				continue
			}
			delete(fresh, keys[i]) // a key twice in the batch: its first only
			agg, _ := header(rec, outbox.HeaderAggregateID)
			seq, _ := header(rec, outbox.HeaderAggregateSeq)
			n, err := strconv.ParseInt(seq, 10, 64)
			if err != nil {
				return err
			}
			ks, aggs, seqs = append(ks, keys[i]), append(aggs, agg), append(seqs, n)
		}
		if len(ks) > 0 {
			if _, err := tx.Exec(ctx, insert, ks, aggs, seqs); err != nil {
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		r.handledN(int64(len(ks)))
		return nil
	})
}

// partitionLoop runs a loop at one worker per partition over the run's
// topic and returns its records/s: a poll loop hands each partition's
// records to that partition's goroutine, which applies what it holds with
// apply, up to batch records at a time, taking every record handed to it
// meanwhile into its next batch, and marks the records for franz-go's
// periodic commit of marked offsets. When the poll loop stops, each
// goroutine finishes what it holds. No partition waits for another,
// nothing bounds what a partition holds, and no commit waits for anything.
func (r *benchRun) partitionLoop(b *testing.B, batch, records int, apply func([]*kgo.Record) error) float64 {
	cl := r.rig.broker.Client(b,
		kgo.ConsumerGroup("g-"+r.topic), kgo.ConsumeTopics(r.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond),
		kgo.AutoCommitMarks())
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	workers := map[int32]chan []*kgo.Record{}
	work := func(ch chan []*kgo.Record) {
		defer wg.Done()
		var held []*kgo.Record
		for open := true; open || len(held) > 0; {
			if len(held) == 0 {
				var recs []*kgo.Record
				if recs, open = <-ch; !open {
					return
				}
				held = append(held, recs...)
			}
			for more := true; more && open && len(held) < batch; {
				select {
				case recs, ok := <-ch:
					held, open = append(held, recs...), ok
				default:
					more = false
				}
			}
			n := min(batch, len(held))
			if err := apply(held[:n]); err != nil {
				b.Error(err)
				return
			}
			cl.MarkCommitRecords(held[:n]...)
			held = held[n:]
		}
	}
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for ctx.Err() == nil {
			cl.PollRecords(ctx, 1000).EachPartition(func(fp kgo.FetchTopicPartition) {
				if len(fp.Records) == 0 {
					return
				}
				ch := workers[fp.Partition]
				if ch == nil {
					ch = make(chan []*kgo.Record, 1024)
					workers[fp.Partition] = ch
					wg.Add(1)
					go work(ch)
				}
				ch <- fp.Records
			})
		}
		for _, ch := range workers {
			close(ch)
		}
	}()
	r.await(b)
	stop()
	<-polled
	wg.Wait()
	cl.Close()
	r.check(b, records)
	return r.rate()
}

// preloaded reads the run's records into memory, one slice per partition,
// and then applies each partition's in a goroutine of its own, as
// processLoop does (batch records per transaction, or one by one): the
// SDK's own loop without consuming from Kafka while it runs.
func (r *benchRun) preloaded(b *testing.B, batch, records int) float64 {
	cl := r.rig.broker.Client(b, kgo.ConsumeTopics(r.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	parts := map[int32][]*kgo.Record{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for got := 0; got < records; {
		fs := cl.PollFetches(ctx)
		require.NoError(b, ctx.Err(), "reading the records")
		fs.EachRecord(func(rec *kgo.Record) {
			parts[rec.Partition] = append(parts[rec.Partition], rec)
			got++
		})
	}
	cl.Close()
	var h consumer.Handler = r
	if batch > 1 {
		h = batchRun{r}
	}
	p, err := consumer.Handle(r.rig.db.Pool, "svc-"+r.topic, h, &consumer.Config{Schema: r.rig.db.Schema, Logger: quietLogger})
	require.NoError(b, err)
	var wg sync.WaitGroup
	for _, recs := range parts {
		wg.Go(func() {
			for len(recs) > 0 {
				n := min(batch, len(recs))
				var err error
				if n == 1 {
					_, err = p.Process(context.Background(), recs[0])
				} else {
					_, err = p.ProcessBatch(context.Background(), recs[:n])
				}
				if err != nil {
					b.Error(err)
					return
				}
				recs = recs[n:]
			}
		})
	}
	wg.Wait()
	r.check(b, records)
	return r.rate()
}
