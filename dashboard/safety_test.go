package dashboard_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/operator"
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
	f.Letters(t)
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
		g.Process(t, "o-9", `{}`, 2)
		_, err := g.db.Pool.Exec(context.Background(), `UPDATE `+g.db.Table("positions")+` SET last_seq = 1 WHERE aggregate_id = 'o-9'`)
		require.NoError(t, err)
		b := newBrowser(t, g.server(t, &dashboard.Config{Authorize: alice}))
		page := b.page("/consumers/billing/confirm?action=resolve_gap&aggregate_type=order&aggregate_id=o-9")
		require.Contains(t, page, "misses nothing: its parked record at seq 2 follows its position 1")
	})

	t.Run("HealthIsSampled", func(t *testing.T) {
		t.Parallel()
		g := newFixture(t)
		g.Letters(t)
		d, err := dashboard.New(g.db.Pool, &dashboard.Config{Schema: g.db.Schema, HealthEvery: time.Hour})
		require.NoError(t, err)
		first := get(d, "localhost", local, "/").Body.String()
		require.Contains(t, first, "every 1h0m0s")
		g.SetFail("o-5", errTest)
		g.Process(t, "o-5", `{}`, 1)
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

// TestCSRFTokenBinding: a form's token is good for its browser, its actor
// and an hour, and for one post.
func TestCSRFTokenBinding(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.Letters(t)
	key := []byte(strings.Repeat("k", 32))
	byHeader := func(r *http.Request) (string, bool) { return r.Header.Get("X-Actor"), r.Header.Get("X-Actor") != "" }
	srv := f.server(t, &dashboard.Config{Authorize: byHeader, CSRFKey: key})
	b := newBrowser(t, srv)
	id := strconv.FormatInt(f.open(t, "o-1")[0].ID, 10)
	confirm := "/consumers/billing/confirm?action=replay&letter=" + id
	as := func(actor string) http.Header { return http.Header{"X-Actor": {actor}} }
	formAs := func(actor string) url.Values {
		req, err := http.NewRequest(http.MethodGet, srv.URL+confirm, nil)
		require.NoError(t, err)
		req.Header = as(actor)
		resp, err := b.c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		m := csrfRE.FindStringSubmatch(string(body))
		require.NotNil(t, m, string(body))
		return url.Values{"csrf": {m[1]}, "action": {"replay"}, "letter": {id}}
	}

	status, _ := b.post("/consumers/billing/requests", formAs("alice"), as("bob"))
	require.Equal(t, http.StatusForbidden, status, "alice's form posted as bob")

	stale := formAs("alice")
	parts := strings.SplitN(stale.Get("csrf"), ".", 3)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	var cookie string
	for _, c := range b.c.Jar.Cookies(u) {
		cookie = c.Value
	}
	issued := strconv.FormatInt(time.Now().Add(-2*time.Hour).Unix(), 10)
	m := hmac.New(sha256.New, key)
	for _, p := range []string{cookie, "alice", issued, parts[1]} {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	stale.Set("csrf", issued+"."+parts[1]+"."+base64.RawURLEncoding.EncodeToString(m.Sum(nil)))
	status, _ = b.post("/consumers/billing/requests", stale, as("alice"))
	require.Equal(t, http.StatusForbidden, status, "a token two hours old")
	require.Zero(t, requestCount(t, f))

	form := formAs("alice")
	status, first := b.post("/consumers/billing/requests", form, as("alice"))
	require.Equal(t, http.StatusSeeOther, status)
	status, second := b.post("/consumers/billing/requests", form, as("alice"))
	require.Equal(t, http.StatusSeeOther, status)
	require.Equal(t, first, second, "the second post of one form shows the first's request")
	require.Equal(t, 1, requestCount(t, f), "and submits nothing")
}

// TestAllowPerAction: Config.Allow sees each action and its scope; what it
// refuses is not offered and not carried out.
func TestAllowPerAction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.Letters(t)
	f.backlog(t)
	var seen []dashboard.Act
	var mu sync.Mutex
	allow := func(_ *http.Request, actor string, a dashboard.Act) error {
		mu.Lock()
		seen = append(seen, a)
		mu.Unlock()
		if a.Action == operator.Discard || a.All || a.Action == operator.DiscardEvent {
			return fmt.Errorf("%s may only replay single letters", actor)
		}
		return nil
	}
	b := newBrowser(t, f.server(t, &dashboard.Config{Authorize: alice, Allow: allow}))
	id := strconv.FormatInt(f.open(t, "o-1")[0].ID, 10)

	page := b.page("/consumers/billing/confirm?action=discard&letter=" + id)
	require.Contains(t, page, `id="refused"`)
	require.Contains(t, page, "alice may only replay single letters")
	require.NotContains(t, page, `method="post"`)
	page = b.page("/consumers/billing/confirm?action=replay")
	require.Contains(t, page, `id="refused"`, "a bulk replay of every letter")
	require.Contains(t, b.page("/producer/dead/7/confirm?action=discard"), `id="refused"`)

	form := b.form("/consumers/billing/confirm?action=replay&letter=" + id)
	form.Set("action", "discard")
	status, _ := b.post("/consumers/billing/requests", form, nil)
	require.Equal(t, http.StatusForbidden, status, "a form edited to discard is refused on the POST")
	require.Zero(t, requestCount(t, f))

	form = b.form("/consumers/billing/confirm?action=replay&letter=" + id)
	status, _ = b.post("/consumers/billing/requests", form, nil)
	require.Equal(t, http.StatusSeeOther, status)
	require.Equal(t, 1, requestCount(t, f))
	mu.Lock()
	defer mu.Unlock()
	last := seen[len(seen)-1]
	require.Equal(t, operator.Replay, last.Action)
	require.Equal(t, "billing", last.Consumer)
	require.Equal(t, id, strconv.FormatInt(last.LetterID, 10))
}
