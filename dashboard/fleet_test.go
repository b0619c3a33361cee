package dashboard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// writeEvents commits n events of distinct aggregates into db's outbox.
func writeEvents(t *testing.T, db *pgtest.DB, n int) {
	t.Helper()
	ctx := context.Background()
	w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for i := range n {
			if _, err := w.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: "o-" + string(rune('a'+i)), EventType: "order.placed", Payload: []byte(`{}`)}); err != nil {
				return err
			}
		}
		return nil
	}))
}

// view GETs path of h from a loopback client and returns the status and
// body.
func view(h http.Handler, path string) (int, string) {
	w := get(h, "localhost", "127.0.0.1:1", path)
	return w.Code, w.Body.String()
}

// row returns the text of the row with id, tags removed.
func row(t *testing.T, body, id string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr id="` + regexp.QuoteMeta(id) + `">(.*?)</tr>`).FindStringSubmatch(body)
	require.NotNil(t, m, "no row %s in %s", id, body)
	return strings.Join(strings.Fields(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(m[1], " ")), " ")
}

func TestFleetOverviewAndDrillIn(t *testing.T) {
	t.Parallel()
	a, b := pgtest.New(t, nil), pgtest.New(t, nil)
	writeEvents(t, a, 3)
	writeEvents(t, b, 5)

	f, err := dashboard.NewFleet([]dashboard.FleetShard{
		{Name: "eu-1", Pool: a.Pool, Schema: a.Schema},
		{Name: "eu-2", Pool: b.Pool, Schema: b.Schema},
		// No such schema: its row says it could not be read, and the
		// others are shown.
		{Name: "gone", Pool: a.Pool, Schema: "no_outbox_here"},
	}, &dashboard.Config{Prefix: "/ops"})
	require.NoError(t, err)

	status, body := view(f, "/ops/")
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, row(t, body, "shard-eu-1"), "eu-1 "+a.Schema+" 3 ")
	require.Contains(t, row(t, body, "shard-eu-1"), "0 live: events wait and no relay runs")
	require.Contains(t, row(t, body, "shard-eu-2"), "eu-2 "+b.Schema+" 5 ")
	require.Contains(t, row(t, body, "shard-gone"), "could not be read")
	require.Regexp(t, `id="fleet-undelivered">8<`, body)
	require.Regexp(t, `id="fleet-failed">1<`, body)

	// Drill into eu-2: its own overview, with a way back.
	status, body = view(f, "/ops/shards/eu-2/")
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, `id="shard">eu-2<`)
	require.Contains(t, body, "schema <b>"+b.Schema+"</b>")
	require.Regexp(t, `id="undelivered">5<`, body)
	require.Contains(t, body, `href="/ops/">Fleet</a>`)
	require.Contains(t, body, `href="/ops/shards/eu-2/static/style.css"`)
	status, _ = view(f, "/ops/shards/eu-2/static/style.css")
	require.Equal(t, http.StatusOK, status)
	status, body = view(f, "/ops/shards/eu-2/producer/dead")
	require.Equal(t, http.StatusOK, status, body)

	status, body = view(f, "/ops/shards/nope/")
	require.Equal(t, http.StatusNotFound, status)
	require.Contains(t, body, "no shard is named nope")
	status, _ = view(f, "/ops/shards/eu-2/../eu-1/")
	require.NotEqual(t, http.StatusInternalServerError, status)
}

func TestFleetShardThatHangsIsBounded(t *testing.T) {
	t.Parallel()
	a, b := pgtest.New(t, nil), pgtest.New(t, nil)
	writeEvents(t, a, 2)
	// b's events table is locked: its health query waits until the
	// fleet's per-shard timeout, and a's row is shown all the same.
	ctx := context.Background()
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE `+b.Table("events")+` IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	f, err := dashboard.NewFleet([]dashboard.FleetShard{{Name: "a", Pool: a.Pool, Schema: a.Schema}, {Name: "b", Pool: b.Pool, Schema: b.Schema}}, nil)
	require.NoError(t, err)
	status, body := view(f, "/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, row(t, body, "shard-a"), "a "+a.Schema+" 2 ")
	require.Contains(t, row(t, body, "shard-b"), "could not be read")
}

func TestNewFleetRefuses(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, nil)
	for name, tc := range map[string]struct {
		shards []dashboard.FleetShard
		cfg    *dashboard.Config
		want   string
	}{
		"none":       {nil, nil, "at least one shard"},
		"dot dot":    {[]dashboard.FleetShard{{Name: "..", Pool: db.Pool}}, nil, "must be 1 to 63"},
		"slash":      {[]dashboard.FleetShard{{Name: "a/b", Pool: db.Pool}}, nil, "must be 1 to 63"},
		"html":       {[]dashboard.FleetShard{{Name: "<b>", Pool: db.Pool}}, nil, "must be 1 to 63"},
		"no pool":    {[]dashboard.FleetShard{{Name: "a"}}, nil, "nil pool"},
		"twice":      {[]dashboard.FleetShard{{Name: "a", Pool: db.Pool}, {Name: "a", Pool: db.Pool}}, nil, "listed twice"},
		"bad schema": {[]dashboard.FleetShard{{Name: "a", Pool: db.Pool, Schema: strings.Repeat("s", 64)}}, nil, "shorter"},
		"bad config": {[]dashboard.FleetShard{{Name: "a", Pool: db.Pool}}, &dashboard.Config{Prefix: "ops"}, "must start with a slash"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := dashboard.NewFleet(tc.shards, tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestFleetRefusesRemoteAndForeignHosts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, nil)
	f, err := dashboard.NewFleet([]dashboard.FleetShard{{Name: "a", Pool: db.Pool, Schema: db.Schema}}, nil)
	require.NoError(t, err)
	for _, path := range []string{"/", "/shards/a/"} {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.RemoteAddr, r.Host = "203.0.113.7:4000", "localhost"
		w := httptest.NewRecorder()
		f.ServeHTTP(w, r)
		require.Equal(t, http.StatusForbidden, w.Code, path)
		r = httptest.NewRequest(http.MethodGet, path, nil)
		r.RemoteAddr, r.Host = "127.0.0.1:4000", "evil.example"
		w = httptest.NewRecorder()
		f.ServeHTTP(w, r)
		require.Equal(t, http.StatusMisdirectedRequest, w.Code, path)
		require.Equal(t, "DENY", w.Header().Get("X-Frame-Options"))
	}
}
