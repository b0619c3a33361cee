package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
)

// Several processes deliver the same records at the same time (a rebalance
// that went wrong, two deployments of one consumer): the unique key and the
// position's row lock make one of them apply each record, in order, and
// the others skip it, without errors.
func TestConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, &pgtest.Opts{MaxConns: 20})
			e := newEffects(t, db)
			p, err := consumer.Handle(db.Pool, "svc", mode.handler(e), fastConfig(db, mode.batch))
			require.NoError(t, err)
			const aggs, perAgg = 3, 15
			var recs []*kgo.Record
			for s := int64(1); s <= perAgg; s++ {
				for a := range aggs {
					r := rec(fmt.Sprint("agg-", a), s, fmt.Sprintf("agg-%d-%d", a, s))
					r.Topic, r.Offset = "orders", nextOffset.Add(1)
					recs = append(recs, r)
				}
			}
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for range 4 {
				wg.Go(func() {
					for i := 0; i < len(recs); i += mode.batch {
						chunk := recs[i:min(i+mode.batch, len(recs))]
						if _, err := p.ProcessBatch(context.Background(), chunk); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			rows, distinct := e.count(t)
			require.Equal(t, aggs*perAgg, rows)
			require.Equal(t, aggs*perAgg, distinct)
			want := make([]int64, perAgg)
			for i := range want {
				want[i] = int64(i + 1)
			}
			for a := range aggs {
				require.Equal(t, want, e.seqs(t, fmt.Sprint("agg-", a)))
			}
		})
	}
}
