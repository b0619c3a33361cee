package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
)

// Records no SDK producer wrote: what the consumer does with the odd ones.
func TestForeignRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hs := func(kv ...string) []kgo.RecordHeader {
		var out []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			out = append(out, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return out
	}

	// A key from Debezium's id header is only as unique as the outbox
	// table's id column; when it is not, later events are skipped as
	// duplicates. The consumer cannot tell them from redeliveries, so it
	// warns, once per topic and then rate-limited, naming the fix.
	for _, md := range modes {
		t.Run("DuplicateOfDebeziumIDWarns"+md.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, nil)
			e := newEffects(t, db)
			var logs lockedBuffer
			cfg := md.config(db)
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			p, err := consumer.Handle(db.Pool, "svc", md.handler(e), cfg)
			require.NoError(t, err)
			var recs []*kgo.Record
			for range 4 {
				recs = append(recs, &kgo.Record{Topic: "dbz", Key: []byte("o"), Value: []byte("v"), Headers: hs(outbox.HeaderDebeziumID, "same")})
			}
			// The same duplicate through the SDK's own key is not the
			// fallback's problem and says nothing.
			recs = append(recs,
				&kgo.Record{Topic: "sdk", Key: []byte("o"), Value: []byte("a"), Headers: hs(outbox.HeaderEventID, "evt", outbox.HeaderDebeziumID, "x")},
				&kgo.Record{Topic: "sdk", Key: []byte("o"), Value: []byte("a"), Headers: hs(outbox.HeaderEventID, "evt", outbox.HeaderDebeziumID, "y")})
			res := processAll(t, p, md.batch, recs...)
			require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Duplicate, consumer.Duplicate, consumer.Duplicate,
				consumer.Applied, consumer.Duplicate}, outcomes(res))
			warned := logs.lines("level=WARN", "Debezium's key fallback", "Config.KeyFunc", outbox.HeaderIdempotencyKey)
			require.Len(t, warned, 1, "one warning for three duplicates of topic dbz, none for topic sdk: %s", warned)
			require.Contains(t, warned[0], "topic=dbz")
			require.Contains(t, warned[0], "key=same")
		})
	}

	// A sequence header the consumer cannot read leaves it no position to
	// hold the aggregate at: the letter says so, and it is true.
	t.Run("MalformedSequenceLetterSaysAggregateNotHeld", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		p, err := consumer.Handle(db.Pool, "svc", e, fastConfig(db, 1))
		require.NoError(t, err)
		for _, bad := range []string{"x", "0", ""} {
			agg := "bad-seq-" + bad
			r := rec(agg, 0, "k-"+agg)
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderAggregateSeq, Value: []byte(bad)})
			res := processAll(t, p, 1, r, rec(agg, 1, "k1-"+agg))
			require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Applied}, outcomes(res),
				"the aggregate's next record does not wait behind the letter")
			l, err := p.Inspector().Letter(ctx, res[0].DeadLetterID)
			require.NoError(t, err)
			require.Contains(t, l.Error, "the aggregate is not held")
			require.Contains(t, l.Error, "Discard of this letter releases nothing")
		}
	})

	// A tombstone (null value, no headers) is a compacted topic's delete
	// marker. Without a key it is dead-lettered with a reason that says
	// what it is; Config.KeyFunc can give it one and the handler sees it.
	t.Run("TombstoneIsDeadLetteredAsOne", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		p, err := consumer.Handle(db.Pool, "svc", e, fastConfig(db, 1))
		require.NoError(t, err)
		res := processAll(t, p, 1, &kgo.Record{Key: []byte("o")}, &kgo.Record{Key: []byte("o"), Value: []byte{}})
		require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.DeadLettered}, outcomes(res))
		require.ErrorIs(t, res[0].Err, consumer.ErrTombstone)
		require.ErrorIs(t, res[0].Err, consumer.ErrNoKey)
		l, err := p.Inspector().Letter(ctx, res[0].DeadLetterID)
		require.NoError(t, err)
		require.Contains(t, l.Error, "tombstone")
		require.NotErrorIs(t, res[1].Err, consumer.ErrTombstone, "an empty value is not a tombstone")
		require.ErrorIs(t, res[1].Err, consumer.ErrNoKey)
	})

	t.Run("TombstoneWithKeyFuncReachesHandler", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		var got []*consumer.Message
		h := consumer.HandlerFunc(func(_ context.Context, _ pgx.Tx, m *consumer.Message) error { got = append(got, m); return nil })
		cfg := fastConfig(db, 1)
		cfg.KeyFunc = func(r *kgo.Record) (string, error) {
			return fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset), nil
		}
		p, err := consumer.Handle(db.Pool, "svc", h, cfg)
		require.NoError(t, err)
		res := processAll(t, p, 1, &kgo.Record{Key: []byte("o")})
		require.Equal(t, []consumer.Outcome{consumer.Applied}, outcomes(res))
		require.Len(t, got, 1)
		require.Nil(t, got[0].Value)
		require.Equal(t, "o", got[0].AggregateID)
	})

	// A compacted topic keeps each key's latest record forever, so no key
	// retention outlasts it.
	t.Run("RetentionWarnsForCompactedTopics", func(t *testing.T) {
		t.Parallel()
		broker := kafkatest.New(t)
		db := pgtest.New(t, nil)
		adm := kadm.NewClient(broker.Client(t))
		mk := func(policy string) string {
			name := fmt.Sprintf("compact-%d", time.Now().UnixNano())
			short := fmt.Sprint(time.Hour.Milliseconds())
			resp, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &policy, "retention.ms": &short}, name)
			require.NoError(t, err)
			require.NoError(t, resp.Err)
			return name
		}
		h := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
		check := func(topic string) []consumer.RetentionWarning {
			cl := broker.Client(t, append([]kgo.Opt{kgo.ConsumerGroup("g"), kgo.ConsumeTopics(topic)}, consumer.ClientOpts()...)...)
			c, err := consumer.New(db.Pool, cl, "svc", h, nil)
			require.NoError(t, err)
			w, err := c.CheckRetention(ctx)
			require.NoError(t, err)
			return w
		}
		compacted := mk("compact")
		w := check(compacted)
		require.Len(t, w, 1, "retention.ms of an hour does not bound a compacted topic")
		require.Equal(t, consumer.RetentionWarning{Kind: consumer.RetentionTopicCompacted, Topic: compacted, Message: w[0].Message}, w[0])
		require.Contains(t, w[0].Message, "topic "+compacted+" is compacted (cleanup.policy=compact)")
		require.Contains(t, w[0].Message, "processed keys are kept 168h0m0s")
		require.Empty(t, check(mk("compact,delete")), "compact,delete still deletes after retention.ms")
	})
}
