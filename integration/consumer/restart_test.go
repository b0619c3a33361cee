package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgserver"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// TestDatabaseRestart crashes PostgreSQL (immediate shutdown, no
// checkpoint) while a consumer applies records, and starts it again. The
// records in flight fail with the connection, are retried, and every
// record ends up applied exactly once, in order, none dead-lettered. Each
// run crashes a cluster of its own (pgtest.Own), whatever
// TEST_DATABASE_URL says.
func TestDatabaseRestart(t *testing.T) {
	for _, run := range runs([]int{1, 20}) {
		batch, concurrency := run.batch, run.concurrency
		t.Run(run.name, func(t *testing.T) {
			const aggregates, perAggregate = 8, 30
			const total = aggregates * perAggregate
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			db := pgtest.New(t, &pgtest.Opts{MaxConns: 10, Server: pgtest.Own(t, pgserver.Config{})})
			b := broker(t)
			topic := topic(t, b, 3)
			_, err := db.Pool.Exec(ctx, `CREATE TABLE `+db.Table("effects")+` (
				n bigint GENERATED ALWAYS AS IDENTITY, event_id text NOT NULL, aggregate text NOT NULL, seq bigint NOT NULL)`)
			require.NoError(t, err)

			var recs []*kgo.Record
			for s := 1; s <= perAggregate; s++ {
				for a := range aggregates {
					agg := fmt.Sprint("acc-", a)
					recs = append(recs, producer.Record(topic, producer.Event{AggregateType: "account", AggregateID: agg, EventType: "account.changed", Payload: []byte("x")},
						producer.Stamp{EventID: fmt.Sprintf("%s-%d", agg, s), Seq: int64(s)}))
				}
			}
			client := b.Client(t)
			require.NoError(t, client.ProduceSync(ctx, recs...).FirstErr())

			applied := func() int {
				var n int
				if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("effects")).Scan(&n); err != nil {
					return -1 // the server is down
				}
				return n
			}
			// Slow enough that the crash lands mid-stream.
			h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.002)`); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+db.Table("effects")+` (event_id, aggregate, seq) VALUES ($1, $2, $3)`, m.EventID, m.AggregateID, m.Seq)
				return err
			})
			group := "g-" + topic
			cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.Addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, consumer.ClientOpts()...)...)
			require.NoError(t, err)
			defer cl.Close()
			c, err := consumer.New(db.Pool, cl, "ledger", h, &consumer.Config{Schema: db.Schema, BatchSize: batch, Concurrency: concurrency, Logger: quiet,
				MaxAttempts: 3, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
			require.NoError(t, err)
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(runCtx) }()
			defer func() {
				stop()
				require.NoError(t, <-done)
			}()

			eventually.True(t, time.Minute, func() bool { return applied() >= total/5 })
			require.NoError(t, db.Server.Restart())
			t.Logf("restarted PostgreSQL with %d of %d applied", applied(), total)

			adm := kadm.NewClient(b.Client(t))
			eventually.True(t, 2*time.Minute, func() bool {
				offs, err := adm.FetchOffsets(ctx, group)
				if err != nil {
					return false
				}
				var sum int64
				offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
				return sum == total
			}, "all offsets committed")

			var rows, distinct, dead, parked int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id),
				(SELECT count(*) FROM `+db.Table("dead_letters")+`), (SELECT count(*) FROM `+db.Table("parked")+`)
				FROM `+db.Table("effects")).Scan(&rows, &distinct, &dead, &parked))
			require.Equal(t, total, rows)
			require.Equal(t, total, distinct)
			require.Zero(t, dead)
			require.Zero(t, parked)
			for a := range aggregates {
				r, err := db.Pool.Query(ctx, `SELECT seq FROM `+db.Table("effects")+` WHERE aggregate = $1 ORDER BY n`, fmt.Sprint("acc-", a))
				require.NoError(t, err)
				seqs, err := pgx.CollectRows(r, pgx.RowTo[int64])
				require.NoError(t, err)
				for i, s := range seqs {
					require.EqualValues(t, i+1, s)
				}
			}
		})
	}
}
