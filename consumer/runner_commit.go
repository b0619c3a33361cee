package consumer

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// commitLoop commits the lanes' done offsets every CommitInterval until
// ctx ends.
func (c *Consumer) commitLoop(ctx context.Context) {
	every(ctx, c.cfg.CommitInterval, func() {
		c.commitMu.Lock()
		defer c.commitMu.Unlock()
		c.mu.Lock()
		lanes := slices.Collect(maps.Values(c.lanes))
		c.mu.Unlock()
		c.commitLocked(ctx, lanes)
	})
}

// commit commits each lane's offset: one past the last record of its done
// prefix.
func (c *Consumer) commit(ctx context.Context, lanes []*lane) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.commitLocked(ctx, lanes)
}

func (c *Consumer) commitLocked(ctx context.Context, lanes []*lane) {
	var marks []*kgo.Record
	var from []*lane
	for _, l := range lanes {
		if m := l.uncommitted(); m != nil {
			marks = append(marks, m)
			from = append(from, l)
		}
	}
	if len(marks) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := c.client.CommitRecords(cctx, marks...); err != nil {
		// Not fatal: the records are applied and dedupe makes their
		// redelivery harmless; the next commit tries again.
		c.log.WarnContext(ctx, "consumer: commit offsets failed", slog.String("error", err.Error()))
		return
	}
	for i, l := range from {
		l.committed(marks[i])
	}
}
