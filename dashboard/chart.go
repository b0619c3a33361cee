package dashboard

import (
	"context"
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/internal/tables"
)

// chartMinutes is how far back a chart goes: three hours, a bar a minute.
const chartMinutes = 180

// chart is a per-minute count drawn as bars, on the server, in SVG: no
// script needed to read it.
type chart struct {
	// Total is the sum over the window, LastHour over its last 60
	// minutes, Peak the largest minute.
	Total     int64
	LastHour  int64
	Peak      int64
	SVG       template.HTML
	Described string
}

// readChart reads the counts of kind (applied or delivered) over the last
// chartMinutes, of name or, when name is "", summed over every name (the
// relays of the schema), and draws them.
func (d *Dashboard) readChart(ctx context.Context, kind, name string) (chart, error) {
	since := time.Now().Truncate(time.Minute).Add(-(chartMinutes - 1) * time.Minute)
	rows, err := d.pool.Query(ctx, tables.For(d.cfg.Schema).Reads.Chart, kind, tables.Filter(name), since)
	if err != nil {
		return chart{}, fmt.Errorf("dashboard: read %s per minute: %w", kind, err)
	}
	counts := make([]int64, chartMinutes)
	var (
		minute time.Time
		n      int64
	)
	_, err = pgx.ForEachRow(rows, []any{&minute, &n}, func() error {
		if i := int(minute.Sub(since) / time.Minute); i >= 0 && i < chartMinutes {
			counts[i] += n
		}
		return nil
	})
	if err != nil {
		return chart{}, fmt.Errorf("dashboard: read %s per minute: %w", kind, err)
	}
	return drawChart(kind, counts), nil
}

// drawChart draws counts (oldest first, a minute each) as an SVG bar
// chart of fixed size. Only numbers and fixed text enter the SVG.
func drawChart(kind string, counts []int64) chart {
	const w, h = 2 * chartMinutes, 48
	c := chart{}
	for i, n := range counts {
		c.Total += n
		c.Peak = max(c.Peak, n)
		if i >= len(counts)-60 {
			c.LastHour += n
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s per minute, last 3 hours">`, w, h+1, w, h+1, kind)
	fmt.Fprintf(&b, `<line x1="0" y1="%d" x2="%d" y2="%d" class="axis"/>`, h, w, h)
	if c.Peak > 0 {
		for i, n := range counts {
			if n == 0 {
				continue
			}
			bh := max(1, int(n*h/c.Peak))
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="2" height="%d"><title>%d</title></rect>`, 2*i, h-bh, bh, n)
		}
	}
	b.WriteString(`</svg>`)
	c.SVG = template.HTML(b.String()) //nolint:gosec // built above from numbers and fixed text only
	c.Described = fmt.Sprintf("%d %s in the last hour, %d in 3 hours, at most %d a minute", c.LastHour, kind, c.Total, c.Peak)
	return c
}
