package producer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/internal/pgtest"
)

// Whatever way the client fails a record (before buffering it, a produce
// error, a time-out) and lets a later one of its aggregate through, the
// later one is not marked delivered: it waits behind the failed one and
// is published again after it.
func TestSettleNeverMarksAnEventBehindAFailedOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"Permanent", errors.New("not authorised")},
		{"Timeout", context.DeadlineExceeded},
		{"BeforeBuffering", kgo.ErrMaxBuffered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, nil)
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			_, err = NewWriter(&WriterConfig{Schema: db.Schema}).Write(ctx, tx,
				Event{AggregateType: "account", AggregateID: "a", EventType: "e", Payload: []byte("1")},
				Event{AggregateType: "account", AggregateID: "a", EventType: "e", Payload: []byte("2")},
				Event{AggregateType: "account", AggregateID: "b", EventType: "e", Payload: []byte("1")})
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			client, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
			require.NoError(t, err)
			t.Cleanup(client.Close)
			r, err := NewRelay(db.Pool, client, &RelayConfig{Schema: db.Schema, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			require.NoError(t, err)
			o := newBucketOwner(r, r.newSession())
			defer o.close()
			require.NoError(t, o.rebalance(ctx, false))
			batch, err := o.claim(ctx, nil)
			require.NoError(t, err)
			require.Len(t, batch, 3)
			results := make([]outcome, len(batch))
			for i, e := range batch {
				results[i] = outcome{topic: "t", partition: 0}
				if e.aggregateID == "a" && e.seq == 1 {
					results[i].err = tc.err
				}
			}
			res, err := r.settleOnce(ctx, batch, results, batch[0].leasedUntil, true)
			require.NoError(t, err)
			require.Equal(t, 1, res.Delivered)
			var delivered []string
			rows, err := db.Pool.Query(ctx, `SELECT aggregate_id || ':' || aggregate_seq FROM `+db.Table("events")+` WHERE published_at IS NOT NULL`)
			require.NoError(t, err)
			for rows.Next() {
				var s string
				require.NoError(t, rows.Scan(&s))
				delivered = append(delivered, s)
			}
			require.NoError(t, rows.Err())
			require.Equal(t, []string{"b:1"}, delivered, "a:2 was acknowledged behind a:1, which failed")
		})
	}
}
