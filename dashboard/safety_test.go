package dashboard_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/dashboard"
)

// get serves one GET of path from remote with host as its Host header.
func get(d http.Handler, host, remote, path string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.Host, r.RemoteAddr = host, remote
	d.ServeHTTP(w, r)
	return w
}

// logBuffer collects a logger's text output.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSafety: what a page of another site, a rebound DNS name, a curious
// client or a long schema name can get out of a dashboard.
func TestSafety(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.letters(t)
	local := "127.0.0.1:5555"

	t.Run("DNSRebindingIsRefused", func(t *testing.T) {
		t.Parallel()
		d, err := dashboard.New(f.db.Pool, &dashboard.Config{Schema: f.db.Schema})
		require.NoError(t, err)
		for _, host := range []string{"attacker.example", "attacker.example:8080", "127.0.0.1.nip.io", ""} {
			w := get(d, host, local, "/consumers/billing/letters")
			require.Equal(t, http.StatusMisdirectedRequest, w.Code, host)
			require.NotContains(t, w.Body.String(), "card processor", host)
			require.Contains(t, w.Body.String(), "Config.Hosts", host)
		}
		for _, host := range []string{"localhost", "localhost:8080", "LOCALHOST.", "127.0.0.1:8080", "[::1]:8080", "ops.localhost"} {
			require.Equal(t, http.StatusOK, get(d, host, local, "/").Code, host)
		}
		d, err = dashboard.New(f.db.Pool, &dashboard.Config{Schema: f.db.Schema, Hosts: []string{"ops.example.com"}})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, get(d, "ops.example.com:443", local, "/").Code)
		require.Equal(t, http.StatusMisdirectedRequest, get(d, "other.example.com", local, "/").Code)
	})

	t.Run("AllowRemoteNeedsHostsAndWarnsWithoutAuthorize", func(t *testing.T) {
		t.Parallel()
		_, err := dashboard.New(f.db.Pool, &dashboard.Config{Schema: f.db.Schema, AllowRemote: true})
		require.ErrorContains(t, err, "AllowRemote needs Config.Hosts")
		var logs logBuffer
		_, err = dashboard.New(f.db.Pool, &dashboard.Config{Schema: f.db.Schema, AllowRemote: true, Hosts: []string{"*"},
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err)
		require.Contains(t, logs.String(), "level=WARN")
		require.Contains(t, logs.String(), "every client that reaches the dashboard reads every record's payload")
	})

	t.Run("EveryResponseCarriesTheHeaders", func(t *testing.T) {
		t.Parallel()
		d, err := dashboard.New(f.db.Pool, &dashboard.Config{Schema: f.db.Schema})
		require.NoError(t, err)
		for _, path := range []string{"/", "/static/style.css", "/static/", "/nosuch", "/consumers/billing/letters/999999"} {
			w := get(d, "localhost", local, path)
			require.Equal(t, "nosniff", w.Header().Get("X-Content-Type-Options"), path)
			require.Equal(t, "no-referrer", w.Header().Get("Referrer-Policy"), path)
			require.Contains(t, w.Header().Get("Content-Security-Policy"), "frame-ancestors 'none'", path)
			require.Equal(t, "DENY", w.Header().Get("X-Frame-Options"), path)
		}
		w := get(d, "localhost", local, "/static/")
		require.Equal(t, http.StatusNotFound, w.Code, "no listing of the static files")
		require.NotContains(t, w.Body.String(), "style.css")
	})

	t.Run("DatabaseErrorsStayInTheLog", func(t *testing.T) {
		t.Parallel()
		var logs logBuffer
		// A schema with no tables: every page's statements fail, and
		// the driver's errors name what the page must not show.
		d, err := dashboard.New(f.db.Pool, &dashboard.Config{Schema: "no_such_schema_here",
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err)
		w := get(d, "localhost", local, "/consumers/billing/letters")
		require.Equal(t, http.StatusInternalServerError, w.Code)
		body, err := io.ReadAll(w.Body)
		require.NoError(t, err)
		require.NotContains(t, string(body), "no_such_schema_here.dead_letters")
		require.NotContains(t, string(body), "SQLSTATE")
		i := strings.Index(string(body), "error_id=")
		require.Positive(t, i, string(body))
		id := string(body)[i+len("error_id=") : i+len("error_id=")+12]
		require.Contains(t, logs.String(), "error_id="+id)
		require.Contains(t, logs.String(), "SQLSTATE")
	})

	t.Run("OverLongSchemaNamesAreRefused", func(t *testing.T) {
		t.Parallel()
		_, err := dashboard.New(f.db.Pool, &dashboard.Config{Schema: strings.Repeat("s", 64)})
		require.ErrorContains(t, err, "PostgreSQL keeps 63")
		_, err = dashboard.New(f.db.Pool, &dashboard.Config{Schema: strings.Repeat("s", 63)})
		require.NoError(t, err)
	})

	t.Run("ResolveGapOfARecordNextInLine", func(t *testing.T) {
		t.Parallel()
		g := newFixture(t)
		g.process(t, "o-9", `{}`, 2)
		_, err := g.db.Pool.Exec(context.Background(), `UPDATE `+g.db.Table("positions")+` SET last_seq = 1 WHERE aggregate_id = 'o-9'`)
		require.NoError(t, err)
		b := newBrowser(t, g.server(t, &dashboard.Config{Authorize: alice}))
		page := b.page("/consumers/billing/confirm?action=resolve_gap&aggregate_type=order&aggregate_id=o-9")
		require.Contains(t, page, "misses nothing: its parked record at seq 2 follows its position 1")
	})

	t.Run("HealthIsSampled", func(t *testing.T) {
		t.Parallel()
		g := newFixture(t)
		g.letters(t)
		d, err := dashboard.New(g.db.Pool, &dashboard.Config{Schema: g.db.Schema, HealthEvery: time.Hour})
		require.NoError(t, err)
		first := get(d, "localhost", local, "/").Body.String()
		require.Contains(t, first, "every 1h0m0s")
		g.setFail("o-5", errTest)
		g.process(t, "o-5", `{}`, 1)
		second := get(d, "localhost", local, "/").Body.String()
		require.Contains(t, second, `id="consumers"`)
		letters := func(page string) string {
			i := strings.Index(page, "/consumers/billing/letters\">")
			return page[i : i+40]
		}
		require.Equal(t, letters(first), letters(second), "the second view shows the sample, not a new read")
		fresh, err := dashboard.New(g.db.Pool, &dashboard.Config{Schema: g.db.Schema, HealthEvery: -1})
		require.NoError(t, err)
		require.NotEqual(t, letters(first), letters(get(fresh, "localhost", local, "/").Body.String()))
	})
}
