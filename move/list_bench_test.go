package move_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/move"
)

// groupAll is the statement List ran before migration 0014, which grouped
// every row of moves: BenchmarkList's baseline.
const groupAll = `SELECT move_id, direction, peer, min(state), count(*), min(started_at), max(updated_at)
FROM %s GROUP BY move_id, direction, peer ORDER BY max(updated_at) DESC, move_id, direction LIMIT $1`

// BenchmarkList times move.List of a shard's 20 latest moves when its
// moves table holds 100 and 1,000 finished moves of 100 aggregates each
// (10,000 and 100,000 rows), against groupAll on the same table, taking
// turns, and reports milliseconds per listing of each and their ratio.
//
//	go test -run '^$' -bench '^BenchmarkList$' -benchtime 20x ./move
func BenchmarkList(b *testing.B) {
	for _, moves := range []int{100, 1000} {
		b.Run(fmt.Sprintf("moves=%d", moves), func(b *testing.B) {
			ctx := context.Background()
			s := newSide(b, "s")
			fillMoves(b, s, moves, 100)
			var list, all time.Duration
			for b.Loop() {
				start := time.Now()
				got, err := move.List(ctx, s.db.Pool, s.db.Schema, 20)
				list += time.Since(start)
				require.NoError(b, err)
				require.Len(b, got, 20)
				start = time.Now()
				rows, err := s.db.Pool.Query(ctx, fmt.Sprintf(groupAll, s.db.Table("moves")), 20)
				require.NoError(b, err)
				rows.Close()
				require.NoError(b, rows.Err())
				all += time.Since(start)
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
			b.ReportMetric(ms(list), "list-ms")
			b.ReportMetric(ms(all), "group-all-ms")
			b.ReportMetric(float64(all)/float64(list), "group-all/list")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// fillMoves records moves finished moves of aggs aggregates each on s, a
// second apart (recordSide), and analyzes the table.
func fillMoves(tb testing.TB, s *side, moves, aggs int) {
	tb.Helper()
	now := time.Now()
	for i := 1; i <= moves; i++ {
		at := now.Add(-time.Duration(i) * time.Second)
		recordSide(tb, s, move.Record{ID: fmt.Sprintf("m-%d", i), Out: true, Peer: "t", State: move.Done, Aggregates: aggs, StartedAt: at, UpdatedAt: at})
	}
	_, err := s.db.Pool.Exec(context.Background(), `ANALYZE `+s.db.Table("moves"))
	require.NoError(tb, err)
}
