package consumer

import (
	"context"
	"errors"
	"runtime/debug"

	"github.com/jackc/pgx/v5"
)

// call runs the handler with [Config.HandlerTimeout], turning a panic into a
// *PanicError and a handler that ran out of its time into a
// *HandlerTimeoutError.
func (p *Processor) call(ctx context.Context, tx pgx.Tx, m *Message) error {
	hctx, cancel := p.handlerContext(ctx)
	defer cancel()
	err := p.callHandler(hctx, tx, m)
	return p.timedOut(ctx, hctx, err)
}

// handlerContext is ctx with [Config.HandlerTimeout], when there is one.
func (p *Processor) handlerContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if p.cfg.HandlerTimeout < 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, p.cfg.HandlerTimeout)
}

// timedOut wraps err in a *HandlerTimeoutError when the handler's context
// hctx ran out of time while ctx, its parent, did not.
func (p *Processor) timedOut(ctx, hctx context.Context, err error) error {
	if err != nil && ctx.Err() == nil && errors.Is(hctx.Err(), context.DeadlineExceeded) {
		return &HandlerTimeoutError{Timeout: p.cfg.HandlerTimeout, Err: err}
	}
	return err
}

func (p *Processor) callHandler(ctx context.Context, tx pgx.Tx, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return p.h.Handle(ctx, tx, m)
}
