package dashboard_test

import (
	"context"
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/ordering"
)

// chromium is Debian's headless-capable browser (apt-get install chromium).
const chromium = "/usr/bin/chromium"

var screenshot = flag.String("screenshot", "", "TestBrowser: write a 1200x800 PNG of the overview to this file")

// TestBrowser drives the dashboard in headless Chromium as an operator
// would: the overview, the dead letters filtered to one aggregate, one
// letter with its value opened, its replay through the confirmation, and
// the request's page until it is done; then checks the database: the
// letter replayed, its successors drained in order.
func TestBrowser(t *testing.T) {
	if _, err := os.Stat(chromium); err != nil {
		if os.Getenv("OUTBOX_REQUIRE_BROWSER") != "" {
			t.Fatalf("OUTBOX_REQUIRE_BROWSER is set but %s is missing (%v); install it with apt-get install chromium", chromium, err)
		}
		t.Skipf("%s is missing; install it with apt-get install chromium, or set OUTBOX_REQUIRE_BROWSER=1 to fail instead", chromium)
	}
	t.Parallel()
	f := newFixture(t)
	f.letters(t)
	f.serveRequests(t)
	srv := f.server(t, &dashboard.Config{Authorize: alice})
	f.setFail("o-1", nil) // the fault is fixed; the operator replays
	f.backlog(t)

	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1200, 800),
		chromedp.UserDataDir(t.TempDir()))...)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(alloc)
	defer cancelTab()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, steps...), what)
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, "read %s", sel)
		return v
	}

	do("open the overview", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#consumers")))
	require.Contains(t, text("#consumers"), "billing")
	require.Equal(t, "3", text("#undelivered"))
	require.Equal(t, "1", text("#dead-events"))
	if *screenshot != "" {
		do("size the viewport", chromedp.EmulateViewport(1200, 800))
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(*screenshot, png, 0o644))
	}

	do("filter the dead letters to o-1",
		chromedp.Click(chromedp.CSS(`#consumers a[href$="/letters"]`)),
		chromedp.WaitVisible(chromedp.CSS("#filter")),
		chromedp.SetValue(chromedp.CSS("#aggregate_id"), "o-1"),
		chromedp.Click(chromedp.CSS("#apply")),
		chromedp.WaitVisible(chromedp.CSS(`#aggregate_id[value="o-1"]`)))
	require.Contains(t, text("#count"), "1 letters match, of 1 aggregates, with 2 records parked")

	do("open the letter and its value",
		chromedp.Click(chromedp.CSS(`#letters a.letter`)),
		chromedp.WaitVisible(chromedp.CSS("#letter")))
	require.Equal(t, "dead", text("#status"))
	require.Contains(t, text("#letter"), "card processor down")
	do("open the value, hidden until clicked",
		chromedp.Click(chromedp.CSS("#value > summary")),
		chromedp.Click(chromedp.CSS("#value details.view > summary")),
		chromedp.WaitVisible(chromedp.CSS("#value details.view pre")))
	require.Contains(t, text("#value details.view pre"), `"total_cents": 1999`)

	do("replay it, through the confirmation",
		chromedp.Click(chromedp.CSS("#replay")),
		chromedp.WaitVisible(chromedp.CSS("#what")))
	require.Contains(t, text("#what"), "then 2 parked successors drain in sequence order")
	do("confirm", chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#request")))

	// The request's page reloads every second until the consumer is done;
	// a read that meets a reload is tried again.
	var status, progress string
	deadline := time.Now().Add(30 * time.Second)
	for status != "done" {
		require.True(t, time.Now().Before(deadline), "the request is still %q after 30s", status)
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		if s, err := chromedp.Run(actx, chromedp.Text(chromedp.CSS("#status"))); err == nil {
			status = s
		}
		if p, err := chromedp.Run(actx, chromedp.Text(chromedp.CSS("#progress"))); err == nil {
			progress = p
		}
		acancel()
	}
	require.Contains(t, progress, "applied 1")
	require.Contains(t, progress, "drained 2")

	// And in the database: the letter replayed, its successors applied
	// in order, nothing parked, the position at 3.
	require.Empty(t, f.open(t, "o-1"))
	require.Equal(t, []string{"o-1:1", "o-1:2", "o-1:3"}, f.appliedOf("o-1"))
	ls, err := deadletter.New(&deadletter.Config{Schema: f.db.Schema}).List(ctx, f.db.Pool,
		&deadletter.ListOpts{Consumer: "billing", AggregateID: "o-1"})
	require.NoError(t, err)
	require.Len(t, ls, 1)
	require.Equal(t, deadletter.StatusReplayed, ls[0].Status)
	tr, err := ordering.New("billing", &ordering.Config{Schema: f.db.Schema})
	require.NoError(t, err)
	agg := ordering.Aggregate{Type: "order", ID: "o-1"}
	last, _, err := tr.Position(ctx, f.db.Pool, agg)
	require.NoError(t, err)
	require.EqualValues(t, 3, last)
	parked, err := tr.ListParked(ctx, f.db.Pool, agg, 0, 0)
	require.NoError(t, err)
	require.Empty(t, parked)

	do("open the audit log", chromedp.Navigate(srv.URL+"/audit"), chromedp.WaitVisible(chromedp.CSS("table.audit")))
	audit := text("table.audit")
	require.Contains(t, audit, "alice")
	require.Contains(t, audit, "letter "+strconv.FormatInt(ls[0].ID, 10))
	require.True(t, strings.Contains(audit, "applied") && strings.Contains(audit, "drained 2"), audit)
}
