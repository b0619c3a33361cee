package letters_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/letters"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/internal/tables"
)

// BenchmarkMillionLetters times the operator's reads on a consumer with a
// million open dead letters in 50 failure groups over 100,000 aggregates:
// a page of List, a filtered page, the grouping by failure, and a capped
// Preview, as the dashboard and `outbox letters` run them.
//
//	go test -run '^$' -bench MillionLetters -benchtime 20x ./deadletter
func BenchmarkMillionLetters(b *testing.B) {
	ctx := context.Background()
	db := pgtest.New(b, nil)
	_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("dead_letters")+` (consumer, topic, kafka_partition, kafka_offset, header_keys, header_values,
    aggregate_type, aggregate_id, aggregate_seq, error, attempts, fingerprint, reason, failure)
SELECT 'svc', 'orders', 0, g, '{}', '{}', 'order', 'o-' || (g % 100000), g / 100000 + 1, 'boom ' || g, 5, int8send(g),
       CASE WHEN g % 10 = 0 THEN 'panic' ELSE 'handler' END, 'handler: failure ' || (g % 50)
FROM generate_series(1, 1000000) g;
ANALYZE `+db.Table("dead_letters"))
	require.NoError(b, err)
	s := letters.New(tables.For(db.Schema).DeadLetters)
	for _, bm := range []struct {
		name string
		f    func() error
	}{
		{"ListPage", func() error {
			_, err := s.List(ctx, db.Pool, &deadletter.ListOpts{Consumer: "svc", Status: deadletter.StatusDead, AfterID: 500000, Limit: 50})
			return err
		}},
		{"ListByReason", func() error {
			_, err := s.List(ctx, db.Pool, &deadletter.ListOpts{Consumer: "svc", Status: deadletter.StatusDead, Reason: "panic", Limit: 50})
			return err
		}},
		{"ListByFailure", func() error {
			_, err := s.List(ctx, db.Pool, &deadletter.ListOpts{Consumer: "svc", Status: deadletter.StatusDead, Failure: "handler: failure 7", Limit: 50})
			return err
		}},
		{"Failures", func() error {
			_, err := s.Failures(ctx, db.Pool, "svc", 100)
			return err
		}},
		{"Preview10k", func() error {
			_, err := s.Preview(ctx, db.Pool, &deadletter.ListOpts{Consumer: "svc", Status: deadletter.StatusDead, Reason: "handler", Limit: 10000})
			return err
		}},
	} {
		b.Run(bm.name, func(b *testing.B) {
			for b.Loop() {
				if err := bm.f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
