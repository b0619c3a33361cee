package producer

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"
)

// listen keeps a LISTEN session open and sends on wake for every
// notification, and once after each (re)connect, since notifications sent
// while it was away are lost. Notifications are hints: the poll in Run is
// what guarantees progress. It returns when ctx ends.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default: // a wake-up is already pending; one is enough
		}
	}
	failures := 0
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, signal, func() { failures = 0 })
		if ctx.Err() != nil {
			return
		}
		failures++
		if r.trace.listener != nil {
			r.trace.listener.TraceListener(ctx, false, err)
		}
		r.log.WarnContext(ctx, "relay: listener lost its connection, reconnecting; polling continues meanwhile",
			slog.String("error", err.Error()), slog.Int("failures", failures))
		r.sleep(ctx, nil, r.retry.Delay(failures))
	}
}

func (r *Relay) listenOnce(ctx context.Context, signal, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, r.cfg.SessionConfig)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, r.sql.Listen); err != nil {
		return err
	}
	connected()
	if r.trace.listener != nil {
		r.trace.listener.TraceListener(ctx, true, nil)
	}
	signal()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		signal()
	}
}
