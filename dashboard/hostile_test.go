package dashboard_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/dashboard"
)

// deepJSON is a small JSON value nested depth levels deep: about 2 bytes a
// level, which indenting naively turns into about depth^2 bytes.
func deepJSON(depth int) string {
	return strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth)
}

// hostile seeds f with the records of a hostile producer: a 20 KB JSON
// nested 9,999 deep, a 10 MB value, markup and ANSI escapes, letters of
// each; and five dead producer events with the deep payload.
func (f *fixture) hostile(t testing.TB) {
	t.Helper()
	f.SetFail("deep", errors.New("deep"))
	f.SetFail("huge", errors.New("huge"))
	f.SetFail("ansi", errors.New("ansi"))
	f.Process(t, "deep", deepJSON(9_999), 1)
	f.Process(t, "huge", strings.Repeat("x", 10<<20), 1, 2)
	f.Process(t, "ansi", "\x1b[2J\x1b[H<script>alert(1)</script>forged", 1)
	for i := range 5 {
		_, err := f.db.Pool.Exec(context.Background(), `INSERT INTO `+f.db.Table("dead_events")+` (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers, created_at, attempts, last_error, hold)
VALUES (100 + $3, gen_random_uuid(), $1, 'order', $1, 1, 'order.placed', convert_to($2, 'UTF8'), '{}', now(), 10, repeat('e', 100000), true)`, fmt.Sprint("deep-", i), deepJSON(9_999), i)
		require.NoError(t, err)
	}
}

// allocated returns the bytes the process allocates while fn runs.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHostileRecordsAreBounded: whatever a record holds, one view of any
// page allocates a bounded amount (here under 5 MB, the server and the
// client together), and the markup is escaped. Not parallel: it measures
// the process's allocations.
func TestHostileRecordsAreBounded(t *testing.T) {
	f := newFixture(t)
	f.hostile(t)
	srv := f.server(t, nil)
	b := newBrowser(t, srv)
	pages := map[string]string{
		"overview":    "/",
		"letters":     "/consumers/billing/letters",
		"dead events": "/producer/dead",
	}
	for _, agg := range []string{"deep", "huge", "ansi"} {
		ls := f.open(t, agg)
		require.Len(t, ls, 1)
		pages["letter "+agg] = fmt.Sprintf("/consumers/billing/letters/%d", ls[0].ID)
	}
	for name, path := range pages {
		var body string
		n := allocated(func() { body = b.page(path) })
		require.Less(t, n, uint64(5<<20), "%s (%s) allocated %d bytes in one view", name, path, n)
		require.NotContains(t, body, "<script>alert", name)
		require.NotContains(t, body, "\x1b[2J", name)
	}
	deep := b.page(pages["letter deep"])
	require.Contains(t, deep, "19999 bytes")
}

// pageViewsScale adds the volume to BenchmarkPageViews' fixture:
// 1,000,000 open letters, 100,000 gaps with 300,000 parked records.
var pageViewsScale = flag.Bool("dashboard.scale", false, "BenchmarkPageViews: add 1,000,000 letters and 100,000 gaps of 300,000 parked records")

// volume fills f's consumer billing with letters open letters (a thousand
// failures, each on its own aggregate) and gaps aggregates with three
// records parked each, in a few statements.
func (f *fixture) volume(t testing.TB, letters, gaps int) {
	t.Helper()
	ctx := context.Background()
	_, err := f.db.Pool.Exec(ctx, `INSERT INTO `+f.db.Table("dead_letters")+` (consumer, topic, kafka_partition, kafka_offset, record_key, value,
    header_keys, header_values, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, error, attempts, fingerprint, reason, failure)
SELECT 'billing', 'orders', 1, i, convert_to('v-' || i, 'UTF8'), convert_to(repeat('x', 200), 'UTF8'), '{}', '{}', 'vol-' || i, 'order', 'vol-' || i, 1,
       'handler failed ' || (i % 1000), 5, sha256(convert_to(i::text, 'UTF8')), 'handler', 'handler: failure ' || (i % 1000)
FROM generate_series(1, $1) AS i`, letters)
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, `INSERT INTO `+f.db.Table("positions")+` (consumer, aggregate_type, aggregate_id, last_seq, parked)
SELECT 'billing', 'order', 'gap-' || i, 0, 3 FROM generate_series(1, $1) AS i`, gaps)
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, `INSERT INTO `+f.db.Table("parked")+` (consumer, aggregate_type, aggregate_id, seq, topic, kafka_partition, kafka_offset,
    record_key, value, header_keys, header_values, idempotency_key)
SELECT 'billing', 'order', 'gap-' || i, s, 'orders', 2, i * 10 + s, NULL, convert_to(repeat('p', 200), 'UTF8'), '{}', '{}', 'gap-' || i || '-' || s
FROM generate_series(1, $1) AS i, generate_series(2, 4) AS s`, gaps)
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, `ANALYZE `+f.db.Table("dead_letters")+`, `+f.db.Table("positions")+`, `+f.db.Table("parked"))
	require.NoError(t, err)
}

// BenchmarkPageViews reports the bytes allocated and the time of one view
// of each page over the hostile fixture (go test -run '^$' -bench
// PageViews -benchmem ./dashboard), and with -dashboard.scale over
// 1,000,000 open letters and 100,000 gaps of 300,000 parked records too
// (go test -run '^$' -bench PageViews -benchmem -benchtime 20x ./dashboard
// -args -dashboard.scale). The overview's consumer rows are read on every
// view here (HealthEvery -1), as if the sample had always just expired.
func BenchmarkPageViews(b *testing.B) {
	f := newFixture(b)
	f.hostile(b)
	if *pageViewsScale {
		f.volume(b, 1_000_000, 100_000)
	}
	d, err := dashboard.New(f.db.Pool, &dashboard.Config{Schema: f.db.Schema, HealthEvery: -1})
	require.NoError(b, err)
	pages := map[string]string{"overview": "/", "letters": "/consumers/billing/letters", "dead_events": "/producer/dead",
		"gaps": "/consumers/billing/gaps", "gaps_older_than": "/consumers/billing/gaps?older_than=1h", "requests": "/requests", "audit": "/audit",
		"search_aggregate": "/consumers/billing/search?aggregate_type=order&aggregate_id=gap-77", "search_key": "/consumers/billing/search?key=vol-77",
		"letters_filtered": "/consumers/billing/letters?aggregate_type=order&aggregate_id=vol-500000"}
	for _, agg := range []string{"deep", "huge"} {
		ls := f.open(b, agg)
		pages["letter_"+agg] = fmt.Sprintf("/consumers/billing/letters/%d", ls[0].ID)
	}
	for name, path := range pages {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodGet, path, nil)
				r.RemoteAddr, r.Host = "127.0.0.1:1", "localhost"
				d.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", path, w.Code, w.Body.String())
				}
			}
		})
	}
}
