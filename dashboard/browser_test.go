package dashboard_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
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

var screenshots = flag.String("screenshots", "", "TestBrowser: write a 1280x800 PNG of each page it visits into this directory (the overview also as ../dashboard.png)")

// TestBrowser drives the dashboard in headless Chromium as an operator
// would: the overview (with a live member and charts), the dead letters
// filtered to one aggregate, one letter with its value opened, its replay
// through the confirmation, and the request's page until it is done; then
// checks the database: the letter replayed, its successors drained in
// order. It then opens the gaps page and filters it, searches for a key,
// and opens the letters of a hostile producer (a value nested 9,999 deep,
// a 10 MB value, terminal escapes). No page it visits is wider than 1280
// px. With -screenshots DIR it writes each page there.
func TestBrowser(t *testing.T) {
	if _, err := os.Stat(chromium); err != nil {
		if os.Getenv("OUTBOX_REQUIRE_BROWSER") != "" {
			t.Fatalf("OUTBOX_REQUIRE_BROWSER is set but %s is missing (%v); install it with apt-get install chromium", chromium, err)
		}
		t.Skipf("%s is missing; install it with apt-get install chromium, or set OUTBOX_REQUIRE_BROWSER=1 to fail instead", chromium)
	}
	t.Parallel()
	f := newFixture(t)
	f.Letters(t)
	f.ServeRequests(t)
	srv := f.server(t, &dashboard.Config{Authorize: alice})
	f.SetFail("o-1", nil) // the fault is fixed; the operator replays
	f.backlog(t)
	f.hostile(t)
	f.Process(t, "o-5", "v", 2, 3) // a gap with no letter: seq 1 never came
	f.activity(t)

	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 800),
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
	// fits checks that the page is no wider than the window, and writes
	// its screenshot when asked.
	fits := func(page string) {
		t.Helper()
		width, err := chromedp.Run(ctx, chromedp.Evaluate[int]("document.documentElement.scrollWidth"))
		require.NoError(t, err)
		require.LessOrEqual(t, width, 1280, "the %s page overflows 1280 px", page)
		if *screenshots == "" {
			return
		}
		do("size the viewport", chromedp.EmulateViewport(1280, 800))
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(*screenshots, page+".png"), png, 0o644))
		if page == "overview" {
			require.NoError(t, os.WriteFile(filepath.Join(*screenshots, "..", "dashboard.png"), png, 0o644))
		}
	}

	do("open the overview", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#consumers")))
	require.Contains(t, text("#consumers"), "billing")
	require.Equal(t, "3", text("#undelivered"))
	require.Equal(t, "6", text("#dead-events"), "one, and five of the hostile producer")
	require.Contains(t, text("#members"), "live")
	require.Contains(t, text("#delivered-chart"), "118 delivered in the last hour")
	fits("overview")

	do("filter the dead letters to o-1",
		chromedp.Click(chromedp.CSS(`#consumers a[href$="/letters"]`)),
		chromedp.WaitVisible(chromedp.CSS("#filter")),
		chromedp.SetValue(chromedp.CSS("#aggregate_id"), "o-1"),
		chromedp.Click(chromedp.CSS("#apply")),
		chromedp.WaitVisible(chromedp.CSS(`#aggregate_id[value="o-1"]`)))
	require.Contains(t, text("#count"), "1 letters match, of 1 aggregates, with 2 records parked")
	fits("letters")

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
	fits("letter")

	do("replay it, through the confirmation",
		chromedp.Click(chromedp.CSS("#replay")),
		chromedp.WaitVisible(chromedp.CSS("#what")))
	require.Contains(t, text("#what"), "then 2 parked successors drain in sequence order")
	fits("confirm")
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
	fits("request")

	// And in the database: the letter replayed, its successors applied
	// in order, nothing parked, the position at 3.
	require.Empty(t, f.open(t, "o-1"))
	require.Equal(t, []string{"o-1:1", "o-1:2", "o-1:3"}, f.AppliedOf("o-1"))
	in := f.proc.Inspector()
	ls, err := in.Letters(ctx, &deadletter.ListOpts{Consumer: "billing", AggregateID: "o-1"})
	require.NoError(t, err)
	require.Len(t, ls, 1)
	require.Equal(t, deadletter.StatusReplayed, ls[0].Status)
	agg := ordering.Aggregate{Type: "order", ID: "o-1"}
	last, _, err := in.Position(ctx, "billing", agg)
	require.NoError(t, err)
	require.EqualValues(t, 3, last)
	parked, err := in.Parked(ctx, "billing", agg, 0, 0)
	require.NoError(t, err)
	require.Empty(t, parked)

	do("open the audit log", chromedp.Navigate(srv.URL+"/audit"), chromedp.WaitVisible(chromedp.CSS("table.audit")))
	audit := text("table.audit")
	require.Contains(t, audit, "alice")
	require.Contains(t, audit, "letter "+strconv.FormatInt(ls[0].ID, 10))
	require.True(t, strings.Contains(audit, "applied") && strings.Contains(audit, "drained 2"), audit)
	fits("audit")

	do("open the gaps and filter them to o-5",
		chromedp.Navigate(srv.URL+"/consumers/billing/gaps"), chromedp.WaitVisible(chromedp.CSS("form.filter")),
		chromedp.SetValue(chromedp.CSS(`input[name="aggregate_id"]`), "o-5"),
		chromedp.Click(chromedp.CSS("form.filter button")),
		chromedp.WaitVisible(chromedp.CSS(`input[name="aggregate_id"][value="o-5"]`)))
	gaps := text("main")
	require.Contains(t, gaps, "order/o-5: waits for seq 1")
	require.Contains(t, gaps, "2 records parked from seq 2")
	fits("gaps")

	do("find a key",
		chromedp.Navigate(srv.URL+"/consumers/billing/search"), chromedp.WaitVisible(chromedp.CSS("#search")),
		chromedp.SetValue(chromedp.CSS(`input[name="key"]`), "evt-o-5-3"),
		chromedp.Click(chromedp.CSS("#search button:last-of-type")),
		chromedp.WaitVisible(chromedp.CSS("#claim")))
	require.Contains(t, text("#claim"), "Claimed")
	fits("search")

	do("open the producer's dead events", chromedp.Navigate(srv.URL+"/producer/dead"), chromedp.WaitVisible(chromedp.CSS("#dead-events")))
	fits("deadevents")

	for _, agg := range []string{"deep", "huge", "ansi"} {
		ls := f.open(t, agg)
		require.Len(t, ls, 1)
		do("open the hostile letter "+agg+" and its value",
			chromedp.Navigate(srv.URL+"/consumers/billing/letters/"+strconv.FormatInt(ls[0].ID, 10)),
			chromedp.WaitVisible(chromedp.CSS("#letter")),
			chromedp.Click(chromedp.CSS("#value > summary")))
		require.NotContains(t, text("#letter"), "\x1b")
		fits("letter_" + agg)
	}
}
