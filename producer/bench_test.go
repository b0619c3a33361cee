package producer_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pacedwrite"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// BenchmarkWrite compares a business transaction (one INSERT) with the same
// transaction plus one Write (event row, sequence upsert, wake-up), at 1 and
// 16 connections. The modes take turns, a second each, for five rounds, so
// that a noisy neighbour hits all alike; each reports its commits/s as a
// ratio to the bare transaction's, measured in the same run. The modes:
//
//   - write: no relay (nobody to notify; writes ask now and then whether a
//     relay is idle);
//
//   - write+relay: a real relay publishing to kfake on the same machine,
//     idle when each of its turns starts (the turn waits for its flag), so
//     that every turn begins by waking it; this is the realistic case;
//
//   - write+idle-flag: a relay row that says idle and never stops saying so,
//     with no relay behind it: every write finds a relay idle, and one per
//     wake slot notifies; the worst case of the wake-up;
//
//   - write+busy-flag: a relay row that says busy (writes ask, nobody is
//     notified).
//
//     go test -run '^$' -bench 'BenchmarkWrite$' -benchtime 1x ./producer
func BenchmarkWrite(b *testing.B) {
	modes := []string{"bare", "write", "write+relay", "write+idle-flag", "write+busy-flag"}
	for _, conns := range []int{1, 16} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			ctx := context.Background()
			txns := map[string]func() error{}
			before := map[string]func(){}
			for _, mode := range modes {
				txns[mode], before[mode] = writeBenchTxn(b, mode, conns)
			}
			commits := map[string]float64{}
			for range b.N {
				for range 5 {
					for _, mode := range modes {
						before[mode]()
						commits[mode] += runFor(ctx, b, time.Second, conns, txns[mode])
					}
				}
			}
			for _, mode := range modes[1:] {
				b.ReportMetric(commits[mode]/commits["bare"], mode+"/bare")
			}
			b.ReportMetric(commits["bare"]/float64(5*b.N), "bare-commits/s")
		})
	}
}

// writeBenchTxn sets up a schema for one mode and returns its transaction
// and what to do before each of its turns.
func writeBenchTxn(b *testing.B, mode string, conns int) (txn func() error, before func()) {
	ctx := context.Background()
	db := pgtest.New(b, &pgtest.Opts{MaxConns: int32(conns) + 4})
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Table("orders")+` (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text NOT NULL, cents bigint NOT NULL)`)
	require.NoError(b, err)
	before = func() {}
	switch mode {
	case "write+idle-flag":
		_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Table("relays")+` (relay_id, idle_until) VALUES ('bench', now() + interval '1 hour')`)
	case "write+busy-flag":
		_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Table("relays")+` (relay_id, idle_until) VALUES ('bench', NULL)`)
	case "write+relay":
		broker := kafkatest.New(b)
		topic := broker.Topic(b, 8)
		relay, rerr := producer.NewRelay(db.Pool, broker.Client(b), &producer.RelayConfig{Schema: db.Schema, Topic: topic, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(b, rerr)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- relay.Run(runCtx) }()
		b.Cleanup(func() { stop(); <-done })
		// Each turn starts with the relay caught up and idle.
		before = func() {
			deadline := time.Now().Add(time.Minute)
			for {
				var idle bool
				require.NoError(b, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+db.Table("relays")+` WHERE idle_until > now())`).Scan(&idle))
				if idle && drained(b, db) {
					return
				}
				require.True(b, time.Now().Before(deadline), "the relay did not go idle within a minute")
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	require.NoError(b, err)
	w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
	insert := `INSERT INTO ` + db.Table("orders") + ` (customer, cents) VALUES ($1, $2)`
	payload := []byte(`{"customer":"c","cents":2500,"items":[{"sku":"A-1","qty":2}]}`)
	var seq atomic.Int64
	return func() error {
		agg := strconv.FormatInt(seq.Add(1)%1000, 10)
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, insert, agg, 2500); err != nil {
			return err
		}
		if mode != "bare" {
			if _, err := w.Write(ctx, tx, producer.Event{AggregateType: "customer", AggregateID: agg, EventType: "order.placed", Payload: payload}); err != nil {
				return err
			}
		}
		return tx.Commit(ctx)
	}, before
}

// runFor runs txn from conns goroutines for d and returns commits/s.
func runFor(ctx context.Context, b *testing.B, d time.Duration, conns int, txn func() error) float64 {
	deadline := time.Now().Add(d)
	var n atomic.Int64
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if err := txn(); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / d.Seconds()
}

// BenchmarkRelayDrain measures how fast a relay empties a pre-filled outbox
// into kfake, against an ideal loop in the same run: claim 1000 with SKIP
// LOCKED, produce them, wait for the acks, mark them. The ideal loop has no
// buckets, no ordering holds, no failure handling. It runs at 20,000 events,
// where start-up and the first claims weigh most, and at 200,000.
//
//	go test -run '^$' -bench RelayDrain/ -benchtime 3x ./producer
func BenchmarkRelayDrain(b *testing.B) {
	for _, events := range []int{20_000, 200_000} {
		b.Run(fmt.Sprintf("events=%d", events), func(b *testing.B) {
			// drain empties a fresh outbox with the ideal loop or the
			// relay and returns events/s.
			drain := func(b *testing.B, mode string) float64 {
				b.StopTimer()
				db := pgtest.New(b, nil)
				broker := kafkatest.New(b)
				topic := broker.Topic(b, 8)
				prefill(b, db, events)
				client := broker.Client(b, kgo.DefaultProduceTopic(topic))
				checkpoint(b, db)
				b.StartTimer()
				start := time.Now()
				if mode == "ideal" {
					idealDrain(b, db, client, topic)
				} else {
					relayDrain(b, db, client, topic)
				}
				return float64(events) / time.Since(start).Seconds()
			}
			// The two take turns within one iteration, so that a noisy
			// neighbour hits both alike and the ratio stays meaningful.
			var ideal, relay float64
			for i := range b.N {
				// Which goes first alternates, so that neither always
				// runs after the other's set-up.
				if i%2 == 0 {
					ideal += drain(b, "ideal")
					relay += drain(b, "relay")
				} else {
					relay += drain(b, "relay")
					ideal += drain(b, "ideal")
				}
			}
			b.ReportMetric(ideal/float64(b.N), "ideal-events/s")
			b.ReportMetric(relay/float64(b.N), "relay-events/s")
			b.ReportMetric(relay/ideal, "relay/ideal")
		})
	}
}

// large turns on the benchmarks' cases that take minutes.
var large = flag.Bool("large", false, "run the benchmarks' cases that take minutes (BenchmarkRelayDrainAged at 1,000,000 events)")

// BenchmarkRelayDrainAged measures the relay's drain of a backlog on a
// table with history against the same drain on a new table, in the same
// run, the two taking turns. The aged table had as many events as the
// backlog written, delivered (published_at set by an UPDATE, as the relay
// marks them), vacuumed and analyzed: its statistics say that almost no
// row is undelivered, as after autovacuum analyzed a table whose rows were
// all delivered; it stays in that state in production until 10% of the
// table changed. Then the backlog is written and the table vacuumed, not
// analyzed. The new table is vacuumed and analyzed with its backlog.
// Autovacuum is off for both tables. Before issue 26's
// fix, every claim on the aged table read and sorted the whole backlog.
// The 1,000,000-event case takes minutes per iteration, its set-up most
// of it, and runs only with -large.
//
//	go test -run '^$' -bench RelayDrainAged -benchtime 1x -count 3 ./producer
//	go test -run '^$' -bench RelayDrainAged -benchtime 1x -count 3 -timeout 60m ./producer -large
func BenchmarkRelayDrainAged(b *testing.B) {
	for _, events := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("events=%d", events), func(b *testing.B) {
			if events > 100_000 && !*large {
				b.Skip("the 1,000,000-event drain takes minutes: run it with -large")
			}
			drain := func(b *testing.B, aged bool) float64 {
				b.StopTimer()
				db := pgtest.New(b, nil)
				broker := kafkatest.New(b)
				topic := broker.Topic(b, 8)
				// Autovacuum is off for both, so that neither drain is
				// vacuumed (or slowed by a vacuum) halfway.
				_, err := db.Pool.Exec(context.Background(), `ALTER TABLE `+db.Table("events")+` SET (autovacuum_enabled = false)`)
				require.NoError(b, err)
				if aged {
					age(b, db, events)
				}
				prefillFrom(b, db, events, aged)
				client := broker.Client(b, kgo.DefaultProduceTopic(topic))
				checkpoint(b, db)
				b.StartTimer()
				start := time.Now()
				relayDrain(b, db, client, topic)
				return float64(events) / time.Since(start).Seconds()
			}
			var fresh, aged float64
			for i := range b.N {
				// Which goes first alternates, as in BenchmarkRelayDrain.
				if i%2 == 0 {
					fresh += drain(b, false)
					aged += drain(b, true)
				} else {
					aged += drain(b, true)
					fresh += drain(b, false)
				}
			}
			b.ReportMetric(fresh/float64(b.N), "fresh-events/s")
			b.ReportMetric(aged/float64(b.N), "aged-events/s")
			b.ReportMetric(aged/fresh, "aged/fresh")
		})
	}
}

// age gives db's events table a history of n delivered events whose
// statistics say so.
func age(b *testing.B, db *pgtest.DB, n int) {
	b.Helper()
	ctx := context.Background()
	events := db.Table("events")
	prefill(b, db, n)
	_, err := db.Pool.Exec(ctx, `UPDATE `+events+` SET published_at = now() WHERE published_at IS NULL`)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `VACUUM ANALYZE `+events)
	require.NoError(b, err)
}

// checkpoint writes out what the set-up dirtied, so that a drain does not
// pay for the writes of its own set-up (or of the previous mode's), which
// are heavier for the aged table.
func checkpoint(b *testing.B, db *pgtest.DB) {
	b.Helper()
	_, err := db.Pool.Exec(context.Background(), `CHECKPOINT`)
	require.NoError(b, err)
}

// relayDrain runs a relay on db until no event is undelivered.
func relayDrain(b *testing.B, db *pgtest.DB, client *kgo.Client, topic string) {
	b.Helper()
	relay, err := producer.NewRelay(db.Pool, client, &producer.RelayConfig{Schema: db.Schema, Topic: topic, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	for !drained(b, db) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	require.NoError(b, <-done)
}

// BenchmarkClaim times the relay's claim statement on its own, on an outbox
// of 200,000 undelivered events over 5,000 aggregates, against a bare claim
// in the same run: the 1000 lowest ids locked with SKIP LOCKED and leased,
// with no buckets and no ordering holds, returning the same columns. Each
// claim's rows are released right after, outside the timing, so that every
// claim sees the same backlog; the two take turns. It runs on the plain
// events table and on the one partitioned by day.
//
//	go test -run '^$' -bench Claim -benchtime 300x ./producer
func BenchmarkClaim(b *testing.B) {
	for _, partitioned := range []bool{false, true} {
		b.Run(fmt.Sprintf("partitioned=%t", partitioned), func(b *testing.B) {
			benchmarkClaim(b, &pgtest.Opts{PartitionEventsByDay: partitioned})
		})
	}
}

func benchmarkClaim(b *testing.B, opts *pgtest.Opts) {
	ctx := context.Background()
	db := pgtest.New(b, opts)
	prefill(b, db, 200_000)
	events := db.Table("events")
	bare := `
WITH c AS (SELECT id FROM ` + events + ` WHERE published_at IS NULL ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)
UPDATE ` + events + ` e SET leased_until = now() + $3 * interval '1 millisecond' FROM c
WHERE e.id = c.id AND cardinality($1::int[]) > 0 AND cardinality($4::int[]) >= 0
RETURNING e.id, e.event_id::text, e.idempotency_key, e.aggregate_type, e.aggregate_id,
       e.aggregate_seq, e.event_type, e.topic, e.content_type, e.payload, e.headers,
       e.created_at, e.attempts, e.permanent_failures, hashtext(e.aggregate_type || ':' || e.aggregate_id), e.leased_until`
	claims := []struct{ name, sql string }{{"bare", bare}, {"relay", producer.ClaimSQL(db.Schema)}}
	release := `UPDATE ` + events + ` SET leased_until = NULL WHERE id = ANY($1)`
	buckets := make([]int32, 64)
	for i := range buckets {
		buckets[i] = int32(i)
	}
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(b, err)
	defer conn.Release()
	// As the relay's lock session; the bare claim runs with the same
	// settings.
	_, err = conn.Exec(ctx, producer.ClaimSessionSQL(db.Schema))
	require.NoError(b, err)
	took := make([]time.Duration, len(claims))
	for b.Loop() {
		for i, c := range claims {
			start := time.Now()
			rows, err := conn.Query(ctx, c.sql, buckets, 1000, 30_000, []int32{})
			require.NoError(b, err)
			var ids []int64
			for rows.Next() {
				v, err := rows.Values()
				require.NoError(b, err)
				ids = append(ids, v[0].(int64))
			}
			require.NoError(b, rows.Err())
			took[i] += time.Since(start)
			require.Len(b, ids, 1000, c.name)
			_, err = conn.Exec(ctx, release, ids)
			require.NoError(b, err)
		}
	}
	for i, c := range claims {
		b.ReportMetric(float64(took[i].Microseconds())/1000/float64(b.N), c.name+"-ms/claim")
		if i > 0 {
			b.ReportMetric(float64(took[i])/float64(took[0]), c.name+"/bare")
		}
	}
}

// prefill inserts n undelivered events over 5,000 aggregates in bulk and
// analyzes the table.
func prefill(b testing.TB, db *pgtest.DB, n int) {
	b.Helper()
	prefillFrom(b, db, n, false)
}

// prefillFrom is prefill after the events of age, whose sequences it
// continues, when after; then it vacuums the table without analyzing it,
// so that the backlog's pages are in the state prefill leaves them in
// (hint bits set, visibility map) and only the history and the statistics
// differ.
func prefillFrom(b testing.TB, db *pgtest.DB, n int, after bool) {
	b.Helper()
	ctx := context.Background()
	var last int64
	if after {
		require.NoError(b, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("events")).Scan(&last))
	}
	_, err := db.Pool.Exec(ctx, `
INSERT INTO `+db.Table("events")+` (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload)
SELECT gen_random_uuid(), g::text, 'account', (g % 5000)::text, g / 5000 + 1, 'funds.moved',
       convert_to('{"account":' || (g % 5000) || ',"amount_cents":2500,"currency":"EUR"}', 'UTF8')
FROM generate_series($2::bigint, $2 + $1 - 1) AS g
ORDER BY g`, n, last)
	require.NoError(b, err)
	vacuum := `VACUUM ANALYZE `
	if after {
		vacuum = `VACUUM `
	}
	_, err = db.Pool.Exec(ctx, vacuum+db.Table("events"))
	require.NoError(b, err)
}

// drained reports whether every event was delivered. It asks whether one
// undelivered row is left rather than counting them: a count of the backlog
// every few milliseconds would take a core from the relay it measures.
func drained(b testing.TB, db *pgtest.DB) bool {
	var done bool
	require.NoError(b, db.Pool.QueryRow(context.Background(), `SELECT NOT EXISTS (SELECT 1 FROM `+db.Table("events")+` WHERE published_at IS NULL)`).Scan(&done))
	return done
}

func idealDrain(b *testing.B, db *pgtest.DB, client *kgo.Client, topic string) {
	ctx := context.Background()
	claim := `
WITH c AS (SELECT id FROM ` + db.Table("events") + ` WHERE published_at IS NULL ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED)
UPDATE ` + db.Table("events") + ` e SET leased_until = now() + interval '30 seconds' FROM c WHERE e.id = c.id
RETURNING e.id, e.event_id::text, e.idempotency_key, e.aggregate_type, e.aggregate_id, e.aggregate_seq, e.event_type, e.payload, e.created_at`
	mark := `UPDATE ` + db.Table("events") + ` SET published_at = now() WHERE id = ANY($1)`
	for {
		rows, err := db.Pool.Query(ctx, claim)
		require.NoError(b, err)
		var ids []int64
		var records []*kgo.Record
		for rows.Next() {
			var (
				id, seq                                int64
				eventID, idemKey, aggType, key, evType string
				payload                                []byte
				created                                time.Time
			)
			require.NoError(b, rows.Scan(&id, &eventID, &idemKey, &aggType, &key, &seq, &evType, &payload, &created))
			ids = append(ids, id)
			// The same headers the relay sends, so both put the same bytes
			// on the wire.
			records = append(records, &kgo.Record{Topic: topic, Key: []byte(key), Value: payload, Headers: []kgo.RecordHeader{
				{Key: outbox.HeaderEventID, Value: []byte(eventID)},
				{Key: outbox.HeaderEventType, Value: []byte(evType)},
				{Key: outbox.HeaderAggregateType, Value: []byte(aggType)},
				{Key: outbox.HeaderAggregateID, Value: []byte(key)},
				{Key: outbox.HeaderAggregateSeq, Value: strconv.AppendInt(nil, seq, 10)},
				{Key: outbox.HeaderIdempotencyKey, Value: []byte(idemKey)},
				{Key: outbox.HeaderOccurredAt, Value: []byte(created.UTC().Format(time.RFC3339Nano))},
			}})
		}
		require.NoError(b, rows.Err())
		if len(ids) == 0 {
			return
		}
		require.NoError(b, client.ProduceSync(ctx, records...).FirstErr())
		_, err = db.Pool.Exec(ctx, mark, ids)
		require.NoError(b, err)
	}
}

// BenchmarkLatency writes one event per transaction at a steady rate and
// reports commit-to-consume latency percentiles (commit returned in the
// writer to record fetched by a consumer) over five seconds, after a
// second of warm-up at the same rate.
//
//	go test -run '^$' -bench Latency -benchtime 1x ./producer
func BenchmarkLatency(b *testing.B) {
	for _, rate := range []int{300, 1000} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			for b.Loop() {
				p50, p99 := measureLatency(b, rate, 5*time.Second)
				b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
			}
		})
	}
}

func measureLatency(b *testing.B, rate int, dur time.Duration) (p50, p99 time.Duration) {
	ctx := context.Background()
	db := pgtest.New(b, &pgtest.Opts{MaxConns: 20})
	broker := kafkatest.New(b)
	topic := broker.Topic(b, 8)
	relayPool, err := pgxpool.New(ctx, db.Server.URL)
	require.NoError(b, err)
	defer relayPool.Close()
	relay, err := producer.NewRelay(relayPool, broker.Client(b), &producer.RelayConfig{Schema: db.Schema, Topic: topic, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	defer func() { stop(); <-done }()

	warmup, total := rate, rate*int(dur/time.Second)
	arrived, received := readArrivals(b, broker, topic, warmup+total, dur+60*time.Second)
	committed := pacedwrite.Run(ctx, b, db.Pool, producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}), rate, total, arrived)
	return pacedwrite.Percentiles(committed, received())
}

// readArrivals reads topic from its start in the background and notes
// when each event id arrived, until want have arrived or within passed.
// arrived counts them so far; received waits for the reader to stop,
// checks that want arrived and returns the times by event id. The
// latencies are matched up with the writers' commit times at the end,
// leaving out pacedwrite's second of warm-up.
func readArrivals(b *testing.B, broker *kafkatest.Broker, topic string, want int, within time.Duration) (arrived func() int, received func() map[string]time.Time) {
	reader := broker.Client(b, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(10*time.Millisecond))
	var (
		mu sync.Mutex
		at = map[string]time.Time{}
	)
	arrived = func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(at)
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		deadline, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		for arrived() < want && deadline.Err() == nil {
			fetches := reader.PollFetches(deadline)
			now := time.Now()
			mu.Lock()
			fetches.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if _, seen := at[string(h.Value)]; h.Key == outbox.HeaderEventID && !seen {
						at[string(h.Value)] = now
					}
				}
			})
			mu.Unlock()
		}
	}()
	return arrived, func() map[string]time.Time {
		<-readDone
		require.Equal(b, want, arrived())
		return at
	}
}
