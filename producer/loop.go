package producer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/d419a114/outbox"
)

// loop is [Relay.Run]'s state between its iterations; only Run's goroutine
// touches it. An iteration (step) rebalances the buckets when that is due,
// looks up the holds that ended, and claims the next batch while the one in
// flight is published; it then launches what it claimed, or backs off after
// a failed claim, or, with nothing to do, goes through the idle steps
// (afterEmpty): linger while traffic was recent, go idle and settle, then
// nap until the next poll, rebalance or hold end.
type loop struct {
	r     *Relay
	owner *bucketOwner
	wake  <-chan struct{}

	// idle is whether the relay said so in its relays row, which makes
	// writers notify.
	idle bool
	// lastWork is when the last batch was claimed.
	lastWork time.Time
	// emptyPolls counts the empty claims since then, which space the
	// lingering looks out (see busyPoll).
	emptyPolls int
	// settling counts the extra looks left after going idle.
	settling int
	// nextRebalance is when the buckets are rebalanced next.
	nextRebalance time.Time
	// failures counts the claims that failed in a row.
	failures int
	// inFlight is the batch being published and settled while the next one
	// is claimed; only the loop starts and lands flights.
	inFlight *flight
	// stopped, once set, ends Run with it: the schema went to CDC mode, or
	// SessionConfig gives no session of its own.
	stopped error
}

// step runs one iteration.
func (l *loop) step(ctx context.Context) {
	l.rebalanceIfDue(ctx)
	if l.stopped != nil {
		return
	}
	// Holds that ended are looked up again before the claim, so that an
	// aggregate whose lease ended goes out with this batch.
	if l.owner.holdsDue() {
		if err := l.owner.refreshHoldsNow(ctx, l.inFlight.aggregates()); err != nil {
			l.r.logError(ctx, "relay: look up leased aggregates, will retry", err)
		}
	}
	batch, claimTook, landed, err := l.claim(ctx)
	switch {
	case err != nil:
		l.failures++
		l.r.logError(ctx, "relay: claim batch, will retry", err)
		if errors.Is(err, errNoSession) {
			// The session is down (or was replaced, and the buckets went
			// with the old one): reconnect at the next step.
			l.nextRebalance = time.Time{}
		}
		l.r.sleep(ctx, l.wake, min(l.r.retry.Delay(l.failures), l.r.cfg.RebalanceInterval))
	case len(batch) > 0:
		l.failures = 0
		l.lastWork = time.Now()
		l.emptyPolls = 0
		l.inFlight = l.r.launch(ctx, batch)
		if l.idle {
			// Found work: writers may stop notifying, since the relay
			// claims again straight away.
			l.idle = false
			if err := l.owner.setIdle(ctx, false); err != nil {
				l.r.logError(ctx, "relay: clear idle flag", err)
			}
		}
	case landed:
		// The claim left out the aggregates of the batch in flight; now
		// that it landed, look again before calling it a day.
	default:
		l.failures = 0
		l.afterEmpty(ctx, claimTook)
	}
}

// rebalanceIfDue rebalances the buckets every RebalanceInterval, and at
// once after the owner lost its session (see bucketOwner.lost). Buckets
// change hands only with nothing in flight.
func (l *loop) rebalanceIfDue(ctx context.Context) {
	now := time.Now()
	if now.Before(l.nextRebalance) && !l.owner.lost {
		return
	}
	l.landInFlight(ctx)
	if err := l.r.checkDispatch(ctx); err != nil {
		l.r.log.ErrorContext(ctx, "relay: schema switched to CDC mode; stopping", slog.String("error", err.Error()))
		l.stopped = err
		return
	}
	err := l.owner.rebalance(ctx, l.idle)
	if errors.Is(err, outbox.ErrNotSession) {
		l.r.log.ErrorContext(ctx, "relay: session connection is not a session; stopping", slog.String("error", err.Error()))
		l.stopped = err
		return
	}
	if err != nil {
		l.r.logError(ctx, "relay: rebalance buckets, will retry", err)
	}
	if ctx.Err() == nil {
		l.owner.warnIfNoBuckets(ctx)
	}
	if t := l.r.trace.rebalance; t != nil && ctx.Err() == nil {
		t.TraceRebalance(ctx, len(l.owner.owned), numBuckets, err)
	}
	l.nextRebalance = now.Add(l.r.cfg.RebalanceInterval)
}

// claim claims the next batch, leaving out the aggregates in flight, and
// then lands the flight. landed says whether there was one. The claim is
// not cancelled with ctx: a claim cut off after the server leased its rows
// would leave them to wait out the lease (and hold their aggregates for the
// next owner) unpublished. Once claimed, a batch is published and marked;
// Run returns after.
func (l *loop) claim(ctx context.Context) (batch []*claimedEvent, took time.Duration, landed bool, err error) {
	start := time.Now()
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.r.cfg.Lease)
	t := l.r.trace.claim
	if t != nil {
		claimCtx = t.TraceClaimStart(claimCtx)
	}
	batch, err = l.owner.claim(claimCtx, l.inFlight.aggregates())
	cancel()
	took = time.Since(start)
	// The claim ends here, before the flight lands: a tracer that times
	// claims times the statement, not the broker's acknowledgements.
	if t != nil {
		t.TraceClaimEnd(claimCtx, len(batch), err)
	}
	landed = l.inFlight != nil
	l.landInFlight(ctx)
	return batch, took, landed, err
}

// landInFlight waits for the batch in flight, if any, to be settled.
func (l *loop) landInFlight(ctx context.Context) {
	if l.inFlight != nil {
		l.r.land(ctx, l.owner, l.inFlight)
		l.inFlight = nil
	}
}

// afterEmpty is what follows a claim that found nothing, the previous batch
// landed: linger, go idle, settle, or nap.
func (l *loop) afterEmpty(ctx context.Context, claimTook time.Duration) {
	if !l.idle && time.Since(l.lastWork) < busyLinger {
		// Busy a moment ago: more is likely on its way. An empty claim that
		// took long (many failed events to look up) spaces the next one
		// out as much, so that lingering never keeps the database busier
		// than half the time.
		poll := min(firstBusyPoll<<min(l.emptyPolls/2, 3), busyPoll)
		l.emptyPolls++
		l.r.sleep(ctx, l.wake, max(poll, claimTook))
		return
	}
	if !l.idle {
		// Going idle: say so, so that writers start to notify, and then
		// look once more right away and once after idleSettle, for rows
		// whose writers asked before the flag was visible (or skipped the
		// question; see wakeQuietFor) and committed only after that first
		// look.
		l.idle = true
		if err := l.owner.setIdle(ctx, true); err != nil {
			l.r.logError(ctx, "relay: set idle flag", err)
		}
		l.settling = 2
	}
	if l.settling > 0 {
		l.settling--
		if l.settling == 0 {
			l.r.sleep(ctx, l.wake, idleSettle)
		}
		return
	}
	nap := min(l.r.cfg.PollInterval, time.Until(l.nextRebalance))
	if end := l.owner.nextHoldEnd(); !end.IsZero() {
		nap = min(nap, time.Until(end))
	}
	l.r.sleep(ctx, l.wake, nap)
	if err := l.owner.refreshIdle(ctx); err != nil {
		l.r.logError(ctx, "relay: refresh idle flag", err)
	}
}
