package dashboard_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

// browser is an HTTP client with cookies that does not follow redirects.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

// with is b for the (sub)test t.
func (b *browser) with(t *testing.T) *browser { return &browser{t: t, base: b.base, c: b.c} }

func newBrowser(t *testing.T, srv *httptest.Server) *browser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, base: srv.URL, c: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// get fetches path and returns the status and body.
func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.c.Get(b.base + path)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, string(body)
}

// page fetches path and requires a 200.
func (b *browser) page(path string) string {
	b.t.Helper()
	status, body := b.get(path)
	require.Equal(b.t, http.StatusOK, status, body)
	return body
}

// post submits form to path and returns the status and the Location.
func (b *browser) post(path string, form url.Values, header http.Header) (int, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := b.c.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Location")
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// form reads the hidden fields of the confirmation page at path.
func (b *browser) form(path string) url.Values {
	b.t.Helper()
	body := b.page(path)
	m := csrfRE.FindStringSubmatch(body)
	require.NotNil(b.t, m, "no CSRF field on %s:\n%s", path, body)
	v := url.Values{"csrf": {m[1]}}
	for _, h := range regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`).FindAllStringSubmatch(body, -1) {
		if h[1] != "csrf" {
			v.Set(h[1], h[2])
		}
	}
	return v
}

func requestCount(t *testing.T, f *fixture) int {
	t.Helper()
	rs, err := operator.New(&operator.Config{Schema: f.db.Schema}).List(context.Background(), f.db.Pool, nil)
	require.NoError(t, err)
	return len(rs)
}

func TestNew(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tests := []struct {
		name    string
		cfg     dashboard.Config
		wantErr string
	}{
		{"Defaults", dashboard.Config{}, ""},
		{"PrefixWithoutSlash", dashboard.Config{Prefix: "outbox"}, "must start with a slash"},
		{"PrefixWithTrailingSlash", dashboard.Config{Prefix: "/outbox/"}, "must start with a slash and not end with one"},
		{"PageSizeTooLarge", dashboard.Config{PageSize: 501}, "PageSize 501 is out of range"},
		{"NegativeCountCap", dashboard.Config{CountCap: -1}, "negative CountCap"},
		{"NegativeKeyRetention", dashboard.Config{KeyRetention: -time.Second}, "negative KeyRetention"},
		{"ShortCSRFKey", dashboard.Config{CSRFKey: []byte("short")}, "at least 32 random bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := dashboard.New(f.db.Pool, &tt.cfg)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
	_, err := dashboard.New(nil, nil)
	require.ErrorContains(t, err, "nil pool")
}

func TestReadOnlyWithoutAuthorize(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.Letters(t)
	b := newBrowser(t, f.server(t, nil))
	letter := f.open(t, "o-1")[0]

	require.Contains(t, b.page("/"), "read-only")
	page := b.page("/consumers/billing/letters/" + strconv.FormatInt(letter.ID, 10))
	require.NotContains(t, page, "Replay…", "a read-only dashboard offers no action")
	confirm := b.page("/consumers/billing/confirm?action=replay&letter=" + strconv.FormatInt(letter.ID, 10))
	require.NotContains(t, confirm, `method="post"`)
	require.Contains(t, confirm, "read-only")

	token := csrfRE.FindStringSubmatch(b.page("/"))
	require.Nil(t, token, "no form, no token")
	for _, path := range []string{"/consumers/billing/requests", "/producer/dead/1"} {
		status, _ := b.post(path, url.Values{"action": {"replay"}, "letter": {strconv.FormatInt(letter.ID, 10)}}, nil)
		require.Equal(t, http.StatusForbidden, status, path)
	}
	require.Zero(t, requestCount(t, f))
	require.Len(t, f.open(t, "o-1"), 1)
}

func TestCSRF(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.Letters(t)
	srv := f.server(t, &dashboard.Config{Authorize: alice})
	b := newBrowser(t, srv)
	id := strconv.FormatInt(f.open(t, "o-1")[0].ID, 10)
	confirm := "/consumers/billing/confirm?action=replay&letter=" + id
	form := b.form(confirm)
	require.Equal(t, "replay", form.Get("action"))
	require.Equal(t, id, form.Get("letter"))
	require.Zero(t, requestCount(t, f), "showing the confirmation changes nothing")

	t.Run("NoToken", func(t *testing.T) {
		b := b.with(t)
		v := url.Values{"action": {"replay"}, "letter": {id}}
		status, _ := b.post("/consumers/billing/requests", v, nil)
		require.Equal(t, http.StatusForbidden, status)
	})
	t.Run("WrongToken", func(t *testing.T) {
		b := b.with(t)
		v := url.Values{"action": {"replay"}, "letter": {id}, "csrf": {"AAAA" + form.Get("csrf")[4:]}}
		status, _ := b.post("/consumers/billing/requests", v, nil)
		require.Equal(t, http.StatusForbidden, status)
	})
	t.Run("TokenWithoutItsCookie", func(t *testing.T) {
		other := newBrowser(t, srv)
		other.page("/")
		status, _ := other.post("/consumers/billing/requests", form, nil)
		require.Equal(t, http.StatusForbidden, status)
	})
	t.Run("CrossOrigin", func(t *testing.T) {
		b := b.with(t)
		status, _ := b.post("/consumers/billing/requests", form, http.Header{"Sec-Fetch-Site": {"cross-site"}})
		require.Equal(t, http.StatusForbidden, status)
	})
	require.Zero(t, requestCount(t, f), "no refused POST submitted a request")

	status, loc := b.post("/consumers/billing/requests", form, nil)
	require.Equal(t, http.StatusSeeOther, status)
	require.Regexp(t, `^/requests/\d+$`, loc)
	r, err := operator.New(&operator.Config{Schema: f.db.Schema}).List(context.Background(), f.db.Pool, nil)
	require.NoError(t, err)
	require.Len(t, r, 1)
	require.Equal(t, "alice", r[0].RequestedBy)
	require.Equal(t, operator.Replay, r[0].Action)
	require.Equal(t, "/requests/"+strconv.FormatInt(r[0].ID, 10), loc)
}

func TestRemoteClients(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, allow := range []bool{false, true} {
		cfg := &dashboard.Config{Schema: f.db.Schema, AllowRemote: allow}
		if allow {
			cfg.Hosts = []string{"ops.example.com"}
		}
		d, err := dashboard.New(f.db.Pool, cfg)
		require.NoError(t, err)
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/", nil) // from 192.0.2.1
		r.Host = "ops.example.com"
		if !allow {
			r.Host = "localhost:8080"
		}
		d.ServeHTTP(w, r)
		if allow {
			require.Equal(t, http.StatusOK, w.Code)
		} else {
			require.Equal(t, http.StatusForbidden, w.Code)
			require.Contains(t, w.Body.String(), "AllowRemote")
		}
	}
}

func TestPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.Letters(t)
	f.ServeRequests(t)
	f.backlog(t)
	b := newBrowser(t, f.server(t, &dashboard.Config{Authorize: alice, Prefix: "/ops"}))
	letter := f.open(t, "o-1")[0]
	id := strconv.FormatInt(letter.ID, 10)

	t.Run("Overview", func(t *testing.T) {
		b := b.with(t)
		page := b.page("/ops/")
		require.Contains(t, page, "acting as <b>alice</b>")
		require.Regexp(t, `<td>billing</td>\s*<td class="bad">none: requests wait</td>\s*<td class="bad"><a href="/ops/consumers/billing/letters">2</a></td>`, page)
		require.Contains(t, page, `id="no-relay"`, "3 events wait and no relay runs")
		require.Contains(t, page, `id="delivered-chart"`)
		require.Contains(t, page, "No consumer process is running")
		require.Contains(t, page, `<a href="/ops/consumers/billing/gaps">1</a>`, "one gap: o-1 behind its letter")
		require.Contains(t, page, `id="dead-events">1<`)
		require.Contains(t, page, `id="undelivered">3<`)
		require.Contains(t, page, "No relay instance")
	})
	t.Run("Letters", func(t *testing.T) {
		b := b.with(t)
		page := b.page("/ops/consumers/billing/letters")
		require.Contains(t, page, "card processor down")
		require.Contains(t, page, "address has no postcode")
		require.Contains(t, page, "<b>2</b> letters match")
		require.Contains(t, page, `id="replay-all"`)
		page = b.page("/ops/consumers/billing/letters?aggregate_id=o-1")
		require.Contains(t, page, "<b>1</b> letters match, of <b>1</b> aggregates, with <b>2</b> records parked")
		require.NotContains(t, page, ">address has no postcode<")
		status, body := b.get("/ops/consumers/billing/letters?failed_after=yesterday")
		require.Equal(t, http.StatusBadRequest, status)
		require.Contains(t, body, "is not a time")
		status, body = b.get("/ops/consumers/billing/letters?reason=handlr")
		require.Equal(t, http.StatusBadRequest, status)
		require.Contains(t, body, "want one of handler, panic, timeout, sequence, input, delivery_limit")
		for _, r := range deadletter.Reasons() {
			require.Contains(t, page, "<option>"+string(r)+"</option>", "the reason filter offers every reason")
		}
	})
	t.Run("Letter", func(t *testing.T) {
		b := b.with(t)
		page := b.page("/ops/consumers/billing/letters/" + id)
		require.Contains(t, page, "card processor down")
		require.Contains(t, page, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "headers as text")
		require.Contains(t, page, "&#34;total_cents&#34;: 1999", "the value as indented JSON")
		require.Contains(t, page, "<details id=\"value\">", "hidden until clicked")
		require.Contains(t, page, "2 of these drain")
		status, _ := b.get("/ops/consumers/shipping/letters/" + id)
		require.Equal(t, http.StatusNotFound, status, "a letter of another consumer")
	})
	t.Run("Gaps", func(t *testing.T) {
		b := b.with(t)
		page := b.page("/ops/consumers/billing/gaps")
		require.Contains(t, page, "order/o-1: waits for seq 1")
		require.Contains(t, page, "Open dead letter <a href=\"/ops/consumers/billing/letters/"+id+"\">")
	})
	t.Run("Confirmations", func(t *testing.T) {
		b := b.with(t)
		page := b.page("/ops/consumers/billing/confirm?action=replay&letter=" + id)
		require.Contains(t, page, "then 2 parked successors drain in sequence order")
		page = b.page("/ops/consumers/billing/confirm?action=discard&reason=handler")
		require.Contains(t, page, "2 letters of 2 aggregates")
		require.Contains(t, page, `name="reason" value="handler"`)
		page = b.page("/ops/consumers/billing/confirm?action=replay")
		require.Contains(t, page, "every open letter")
		require.Contains(t, page, `name="all" value="1"`)
		page = b.page("/ops/consumers/billing/confirm?action=resolve_gap&aggregate_type=order&aggregate_id=o-1")
		require.Contains(t, page, "waits for its open dead letter")
		require.NotContains(t, page, `method="post"`, "nothing to skip: the gap is the letter")
		page = b.page("/ops/producer/dead/7/confirm?action=replay")
		require.Contains(t, page, "Put dead event 7 (order.placed, order/42 seq 1) back into the outbox")
		status, _ := b.get("/ops/consumers/billing/confirm?action=explode")
		require.Equal(t, http.StatusBadRequest, status)
	})
	t.Run("ProducerDeadEventsAndTheirReplay", func(t *testing.T) {
		b := b.with(t)
		page := b.page("/ops/producer/dead")
		require.Contains(t, page, "MESSAGE_TOO_LARGE")
		form := b.form("/ops/producer/dead/7/confirm?action=replay")
		status, loc := b.post("/ops/producer/dead/7", form, nil)
		require.Equal(t, http.StatusSeeOther, status)
		require.Equal(t, "/ops/producer/dead?status=replayed", loc)
		require.Contains(t, b.page(loc), "order.placed")
		var undelivered int
		require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+f.db.Table("events")+` WHERE id = 7 AND published_at IS NULL`).Scan(&undelivered))
		require.Equal(t, 1, undelivered)
		require.Contains(t, b.page("/ops/audit"), "producer dead event 7")
		status, again := b.post("/ops/producer/dead/7", form, nil)
		require.Equal(t, http.StatusSeeOther, status, "the same form posted twice acts once")
		require.Equal(t, loc, again)
		require.Equal(t, 1, strings.Count(b.page("/ops/audit"), "producer dead event 7"))
		require.Contains(t, b.page("/ops/producer/dead/7/confirm?action=replay"), "replayed already: there is nothing to do")
		status, _ = b.get("/ops/producer/dead/8/confirm?action=replay")
		require.Equal(t, http.StatusNotFound, status)
	})
	t.Run("RequestsAndAudit", func(t *testing.T) {
		b := b.with(t)
		f.SetFail("o-2", nil)
		l2 := strconv.FormatInt(f.open(t, "o-2")[0].ID, 10)
		status, loc := b.post("/ops/consumers/billing/requests", b.form("/ops/consumers/billing/confirm?action=discard&letter="+l2), nil)
		require.Equal(t, http.StatusSeeOther, status)
		eventually.True(t, 20*time.Second, func() bool { return strings.Contains(b.page(loc), `id="status" class="done"`) })
		page := b.page(loc)
		require.Contains(t, page, "discarded 1")
		require.Contains(t, page, "requested")
		require.Contains(t, b.page("/ops/requests"), "alice")
		require.Contains(t, b.page("/ops/audit?consumer=billing"), "letter "+l2)
		require.Empty(t, f.open(t, "o-2"))
	})
}

func TestBoundedPaging(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// Five aggregates, each one letter.
	for i := range 5 {
		agg := "p-" + strconv.Itoa(i)
		f.SetFail(agg, errTest)
		f.Process(t, agg, "v", 1)
	}
	b := newBrowser(t, f.server(t, &dashboard.Config{PageSize: 2, CountCap: 3}))
	letterIDs := regexp.MustCompile(`class="letter" href="/consumers/billing/letters/(\d+)"`)
	next := regexp.MustCompile(`id="next" href="([^"]+)"`)

	var seen []string
	path := "/consumers/billing/letters?reason=handler"
	for pages := 0; path != ""; pages++ {
		require.Less(t, pages, 3, "five letters in pages of two")
		page := b.page(strings.ReplaceAll(path, "&amp;", "&"))
		require.Contains(t, page, "<b>3&#43;</b> letters match, of at least", "counts stop at CountCap")
		ids := letterIDs.FindAllStringSubmatch(page, -1)
		require.LessOrEqual(t, len(ids), 2)
		for _, m := range ids {
			seen = append(seen, m[1])
		}
		path = ""
		if m := next.FindStringSubmatch(page); m != nil {
			path = m[1]
		}
	}
	require.Len(t, seen, 5)
	want, err := f.proc.Inspector().Letters(context.Background(), &deadletter.ListOpts{Consumer: "billing"})
	require.NoError(t, err)
	for i, l := range want {
		require.Equal(t, strconv.FormatInt(l.ID, 10), seen[i], "pages in id order, none twice")
	}

	// The gaps page stops at PageSize too: five aggregates each wait.
	for i := range 5 {
		f.Process(t, "p-"+strconv.Itoa(i), "v", 2)
	}
	all, err := f.proc.Inspector().Gaps(context.Background(), &ordering.GapOpts{Consumer: "billing"})
	require.NoError(t, err)
	require.Len(t, all.Gaps, 5)
	var gaps []string
	for path := "/consumers/billing/gaps"; path != ""; {
		page := b.page(path)
		require.LessOrEqual(t, strings.Count(page, `<section class="gap">`), 2)
		for _, m := range regexp.MustCompile(`<h3>order/(p-\d)`).FindAllStringSubmatch(page, -1) {
			gaps = append(gaps, m[1])
		}
		path = ""
		if m := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(page); m != nil {
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	require.Equal(t, []string{"p-0", "p-1", "p-2", "p-3", "p-4"}, gaps, "pages in aggregate order, none twice")
	page := b.page("/consumers/billing/gaps?aggregate_id=p-3")
	require.Equal(t, 1, strings.Count(page, `<section class="gap">`))
	require.Contains(t, page, "order/p-3: waits for seq 1")
	require.Contains(t, b.page("/consumers/billing/gaps?older_than=1h"), "No open gap matches.")
	status, body := b.get("/consumers/billing/gaps?aggregate_id=" + strings.Repeat("x", 2000))
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "no field takes more than 1024")
}

func TestDedupeHorizonWarnings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.Letters(t)
	b := newBrowser(t, f.server(t, &dashboard.Config{KeyRetention: 24 * time.Hour, HealthEvery: -1}))
	require.Regexp(t, `<td>ok</td>\s*</tr>`, b.page("/"), "nothing is older than a day yet")

	_, err := f.db.Pool.Exec(ctx, `UPDATE `+f.db.Table("dead_letters")+` SET first_failed_at = now() - interval '3 days'`)
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, `UPDATE `+f.db.Table("parked")+` SET parked_at = now() - interval '2 days'`)
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, `INSERT INTO `+f.db.Table("processed_keys")+` (consumer, key, processed_at) VALUES ('billing', 'old', now() - interval '4 days')`)
	require.NoError(t, err)
	page := b.page("/")
	require.Contains(t, page, "open dead letters are older (3d) than the key retention (24h0m0s)")
	require.Contains(t, page, "parked records are older (2d)")
	require.NotContains(t, page, "processed keys are kept longer", "the oldest key needs a scan; outbox consumers reports it")
}

func TestResolveGap(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ServeRequests(t)
	// o-5's seq 1 never arrives; 2 and 3 wait.
	f.Process(t, "o-5", "v", 2, 3)
	b := newBrowser(t, f.server(t, &dashboard.Config{Authorize: alice}))
	require.Contains(t, b.page("/consumers/billing/gaps"), "order/o-5: waits for seq 1")
	confirm := "/consumers/billing/confirm?action=resolve_gap&aggregate_type=order&aggregate_id=o-5"
	require.Contains(t, b.page(confirm), "give up sequences 1 to 1 of aggregate order/o-5 for good")
	status, loc := b.post("/consumers/billing/requests", b.form(confirm), nil)
	require.Equal(t, http.StatusSeeOther, status)
	eventually.True(t, 20*time.Second, func() bool { return strings.Contains(b.page(loc), `id="status" class="done"`) })
	require.Equal(t, []string{"o-5:2", "o-5:3"}, f.AppliedOf("o-5"))
	require.Contains(t, b.page("/consumers/billing/gaps"), "No open gap matches.")
}
