package dashboard_test

import (
	"context"
	"errors"
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
	f.setFail("deep", errors.New("deep"))
	f.setFail("huge", errors.New("huge"))
	f.setFail("ansi", errors.New("ansi"))
	f.process(t, "deep", deepJSON(9_999), 1)
	f.process(t, "huge", strings.Repeat("x", 10<<20), 1, 2)
	f.process(t, "ansi", "\x1b[2J\x1b[H<script>alert(1)</script>forged", 1)
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

// BenchmarkPageViews reports the bytes allocated and the time of one view
// of each page over the hostile fixture (go test -run '^$' -bench
// PageViews -benchmem ./dashboard).
func BenchmarkPageViews(b *testing.B) {
	f := newFixture(b)
	f.hostile(b)
	d, err := dashboard.New(f.db.Pool, &dashboard.Config{Schema: f.db.Schema})
	require.NoError(b, err)
	pages := map[string]string{"overview": "/", "letters": "/consumers/billing/letters", "dead_events": "/producer/dead",
		"gaps": "/consumers/billing/gaps", "requests": "/requests", "audit": "/audit"}
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
				r.RemoteAddr = "127.0.0.1:1"
				d.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", path, w.Code, w.Body.String())
				}
			}
		})
	}
}
