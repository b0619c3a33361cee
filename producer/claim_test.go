package producer_test

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// TestClaimHolds runs the claim statement on its own, on both layouts, over
// rows each hold covers, and checks which rows it leases: those of an
// aggregate behind a failed row in backoff wait, but not its rows before
// that failed row; an aggregate with a held dead event waits whole; the
// aggregates in flight ($4) wait; the rest go out, at most the batch size,
// lowest ids first.
func TestClaimHolds(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "partitioned"}[partitioned], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t, &pgtest.Opts{PartitionEventsByDay: partitioned})
			events := db.Table("events")
			// One row per (aggregate, seq), in id order.
			ids := map[string]int64{}
			for _, r := range []struct {
				agg string
				seq int
			}{{"a", 1}, {"b", 1}, {"a", 2}, {"d", 1}, {"c", 2}, {"a", 3}, {"d", 2}, {"b", 2}, {"e", 1}, {"f", 1}, {"f", 2}} {
				var id int64
				key := r.agg + strconv.Itoa(r.seq)
				require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO `+events+` (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload)
VALUES (gen_random_uuid(), $3, 'account', $1, $2, 'funds.moved', '\x00') RETURNING id`, r.agg, r.seq, key).Scan(&id))
				ids[key] = id
			}
			// a2 and d1 failed and wait out a backoff (the trigger lists
			// them in retrying_events).
			_, err := db.Pool.Exec(ctx, `UPDATE `+events+` SET attempts = 1, next_attempt_at = now() + interval '1 hour' WHERE id = ANY($1)`,
				[]int64{ids["a2"], ids["d1"]})
			require.NoError(t, err)
			// c's first event is dead and holds its aggregate.
			_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Table("dead_events")+` (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers, created_at, attempts, last_error, hold)
VALUES (0, gen_random_uuid(), 'c-1', 'account', 'c', 1, 'funds.moved', '\x00', '{}', now(), 10, 'too large', true)`)
			require.NoError(t, err)
			// e is in flight: the claim leaves out its bucket hash.
			var eHash int32
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT hashtext('account:e')`).Scan(&eHash))

			conn, err := db.Pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(ctx, producer.ClaimSessionSQL(db.Schema))
			require.NoError(t, err)
			buckets := make([]int32, producer.NumBuckets)
			for i := range buckets {
				buckets[i] = int32(i)
			}
			claim := func(batch int) []int64 {
				rows, err := conn.Query(ctx, producer.ClaimSQL(db.Schema), buckets, batch, 30_000, []int32{eHash})
				require.NoError(t, err)
				got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (int64, error) {
					v, err := row.Values()
					if err != nil {
						return 0, err
					}
					return v[0].(int64), nil
				})
				require.NoError(t, err)
				slices.Sort(got)
				return got
			}
			// The batch size counts only rows that pass the holds: the
			// two lowest are a1 and b1, whatever is held among them.
			require.Equal(t, []int64{ids["a1"], ids["b1"]}, claim(2))
			// Published; b2 would wait while b1 is leased.
			_, err = conn.Exec(ctx, `UPDATE `+events+` SET published_at = now(), leased_until = NULL WHERE id = ANY($1)`, []int64{ids["a1"], ids["b1"]})
			require.NoError(t, err)
			require.Equal(t, []int64{ids["b2"], ids["f1"], ids["f2"]}, claim(100))
		})
	}
}
