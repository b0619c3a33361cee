package producer

// TEMPORARY: tracing to chase the crash-matrix reorder. Not for commit.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

var traceOn = os.Getenv("OUTBOX_TRACE") != ""

func (r *Relay) trace(ctx context.Context, what string, batch []*claimedEvent, extra func(i int) string) {
	if !traceOn {
		return
	}
	var b strings.Builder
	for i, e := range batch {
		if e.aggregateID != "agg-004" && os.Getenv("OUTBOX_TRACE") != "all" {
			continue
		}
		fmt.Fprintf(&b, " [id=%d %s seq=%d", e.id, e.aggregateID, e.seq)
		if extra != nil {
			b.WriteString(" " + extra(i))
		}
		b.WriteString("]")
	}
	r.log.WarnContext(ctx, "TRACE "+what, slog.Int("n", len(batch)), slog.String("ev", b.String()))
}
