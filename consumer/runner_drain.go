package consumer

import (
	"context"
	"log/slog"
	"time"
)

// drainSweep is how often [Consumer.Run] looks for parked records left in
// line, by another process's Replay, Discard or ResolveGap or by a process
// that stopped between two chunks.
const drainSweep = time.Minute

// drainLoop runs DrainReady at start, when an operator action asks for it,
// and every drainSweep, until ctx ends.
func (c *Consumer) drainLoop(ctx context.Context) {
	t := time.NewTicker(drainSweep)
	defer t.Stop()
	for {
		n, err := c.proc.DrainReady(ctx)
		if n > 0 {
			c.log.InfoContext(ctx, "consumer: drained parked records left in line", slog.Int("records", n))
		}
		if err != nil && ctx.Err() == nil {
			c.log.WarnContext(ctx, "consumer: draining parked records failed; retrying at the next sweep",
				slog.Duration("sweep", drainSweep), slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.proc.leftInLine():
		}
	}
}

// stopDrainer cancels the drainer and waits for it, at most abandonAfter,
// then ends the sessions of whatever transactions are still open.
func (c *Consumer) stopDrainer(ctx context.Context, stop context.CancelFunc, drained <-chan struct{}) {
	stop()
	t := time.NewTimer(abandonAfter)
	defer t.Stop()
	select {
	case <-drained:
		return
	case <-t.C:
	}
	if err := endSessions(context.WithoutCancel(ctx), c.log, c.open.pids()); err != nil {
		c.log.ErrorContext(ctx, "consumer: could not end the sessions of the drainer's transactions; they end when its handler returns",
			slog.String("error", err.Error()))
	}
}
