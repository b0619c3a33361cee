package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/tables"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

// requestLease is how long a claimed request stays the claiming process's
// without a renewal; a process that dies or stalls leaves it to another
// after this. Its heartbeat renews it every third of it.
const requestLease = 30 * time.Second

// reportEvery is how often a bulk request writes the counts of its run
// (matched, failed, skipped); what was done is counted with each action.
const reportEvery = time.Second

// errStopping is why a request's carrier stops early when its server
// stops.
var errStopping = errors.New("consumer: stopping")

// requestTuning holds what tests change about serving requests; the zero
// value is production's.
type requestTuning struct {
	// lease replaces requestLease when positive.
	lease time.Duration
	// beat, when set, runs before each renewal of the heartbeat: a test
	// blocks in it to stall the heartbeat, as a paused process would.
	beat func(ctx context.Context)
}

// ServeRequests carries out the operator requests (package operator)
// addressed to the consumer until ctx ends: it looks for them every
// [Config.RequestPoll] and, when the Processor's db is a *pgxpool.Pool, as
// soon as one is submitted (on a connection of its own, LISTENing on
// operator.Channel). [Consumer.Run] calls it; a poll loop of one's own
// around Process should run it beside the loop. It returns nil once ctx
// ends (a clean stop, as for [Consumer.Run]).
//
// A request is carried out through Replay, Discard and ResolveGap, with
// the request's requester as the actor of their audit rows. Each action
// counts itself in its own transaction, under the process's claim on the
// request, and a heartbeat renews the claim's lease while the request is
// carried out (through a long action and through Rate's pauses alike). A
// process that stalls past the lease loses the request to another: its
// action in flight rolls back, and it stops and writes nothing more about
// the request. A request cancelled meanwhile (operator.Store.Cancel) is
// stopped before its next action.
//
// When ctx ends, no new action starts, and the one in flight gets
// [Config.ShutdownGrace] to finish; then its context is cancelled, and an
// action that still has not returned a second later is left behind: its
// transaction's database session is ended (the server rolls it back) and
// ServeRequests returns without it. A request left half-done is given up
// to be taken up again by a process of the consumer (at once, or when its
// lease runs out), which acts on the letters still open; its counts stay
// exact.
//
// A routing Processor serves the requests of every target, each in its
// own database, until ctx ends.
func (p *Processor) ServeRequests(ctx context.Context) error {
	if p.route != nil {
		return p.route.each(func(t *Processor) error { return t.ServeRequests(ctx) })
	}
	poll := p.cfg.RequestPoll
	if poll < 0 {
		poll = time.Second
	}
	wake := make(chan struct{}, 1)
	// The listener stops, and is waited for, before ServeRequests returns.
	var wg sync.WaitGroup
	defer wg.Wait()
	listening, stopListening := context.WithCancel(ctx)
	defer stopListening()
	if cfg := p.sessionConfig(); cfg != nil {
		wg.Go(func() { p.listenRequests(listening, cfg, wake) })
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		for ctx.Err() == nil {
			done, err := p.serveOne(ctx)
			if err != nil && ctx.Err() == nil {
				p.log.WarnContext(ctx, "consumer: operator request failed; trying again at the next poll", slog.String("error", err.Error()))
			}
			if !done {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-wake:
		}
	}
}

// listenRequests signals wake for each notification on the schema's
// operator channel naming this consumer, and after each (re)connect. It
// returns when ctx ends.
func (p *Processor) listenRequests(ctx context.Context, cfg *pgx.ConnConfig, wake chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	for ctx.Err() == nil {
		err := p.listenOnce(ctx, cfg, signal)
		if ctx.Err() != nil {
			return
		}
		p.log.WarnContext(ctx, "consumer: operator request listener lost its connection; polling continues meanwhile", slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
		case <-time.After(p.cfg.RequestPoll):
		}
	}
}

func (p *Processor) listenOnce(ctx context.Context, cfg *pgx.ConnConfig, signal func()) error {
	conn, err := p.requestSession(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, tables.OperatorFor(p.cfg.Schema).Listen); err != nil {
		return err
	}
	signal()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload == p.name {
			signal()
		}
	}
}

// serveOne claims one request and carries it out; it reports whether
// there was one and serveOne went through with it. When ctx ends
// meanwhile, it stops as ServeRequests says.
func (p *Processor) serveOne(ctx context.Context) (bool, error) {
	lease := p.requests.lease
	if lease <= 0 {
		lease = requestLease
	}
	r, err := p.ops.Claim(ctx, p.db, p.name, lease)
	if err != nil || r == nil {
		return false, err
	}
	p.log.InfoContext(ctx, "consumer: carrying out an operator request", slog.Int64("request_id", r.ID), slog.Int64("claim", r.Claim),
		slog.String("action", string(r.Action)), slog.String("requested_by", r.RequestedBy))
	c := &carrier{p: p, r: r, lease: lease, stopping: ctx}
	// The action's context outlives ctx by ShutdownGrace; c.stop ends it
	// earlier when the claim is lost or the request cancelled.
	work, stop := context.WithCancelCause(withOpenSet(context.WithoutCancel(ctx), &c.open))
	defer stop(nil)
	c.stop = stop
	var (
		carried error
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		carried = c.run(withRequest(operator.WithActor(work, r.RequestedBy), r))
	}()
	select {
	case <-done:
		return ctx.Err() == nil, carried
	case <-ctx.Done():
	}
	if !within(done, p.cfg.ShutdownGrace) {
		stop(errStopping)
		if !within(done, abandonAfter) {
			p.log.ErrorContext(ctx, "consumer: an operator request's action did not return after ShutdownGrace and the cancel of its context; ending its transaction and going on without it; the request is taken up again when its lease runs out",
				slog.Int64("request_id", r.ID), slog.Duration("shutdown_grace", p.cfg.ShutdownGrace), slog.Duration("lease", lease))
			if err := endSessions(context.WithoutCancel(ctx), p.log, c.open.pids()); err != nil {
				p.log.ErrorContext(ctx, "consumer: could not end the session of an abandoned operator request's transaction; it ends when its handler returns",
					slog.Int64("request_id", r.ID), slog.String("error", err.Error()))
			}
			return false, nil
		}
	}
	return false, carried
}

// carrier carries out one claimed request. Its fields are set before its
// goroutine starts; r's Progress and Error are the carrying goroutine's,
// and the heartbeat reads only r's ID and Claim.
type carrier struct {
	p     *Processor
	r     *operator.Request
	lease time.Duration
	// stopping ends when the server stops: no new action starts then.
	stopping context.Context
	// stop cancels the action's context with its cause: the fence error
	// the heartbeat met, or errStopping after ShutdownGrace.
	stop context.CancelCauseFunc
	// open holds the sessions of the action's transactions, for
	// serveOne to end when it abandons the action.
	open openSet
}

// run carries out the request with its heartbeat beside it, then writes
// its end: finished (done, failed, or cancelled meanwhile), given up half
// done when the server stops, or nothing when another process claimed it.
func (c *carrier) run(ctx context.Context) error {
	beating, stopBeating := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { c.heartbeat(beating) })
	failed, stopped := c.carry(ctx)
	stopBeating()
	wg.Wait()
	return c.end(ctx, failed, stopped)
}

// heartbeat renews the lease every third of it until ctx ends. When the
// renewal finds the claim lost or the request cancelled, it cancels the
// action in flight (which could not commit any more) and returns.
func (c *carrier) heartbeat(ctx context.Context) {
	t := time.NewTicker(c.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if c.p.requests.beat != nil {
			c.p.requests.beat(ctx)
		}
		err := c.p.ops.Renew(ctx, c.p.db, c.r, c.lease)
		switch {
		case ctx.Err() != nil:
			return
		case fenced(err):
			c.stop(err)
			return
		case err != nil:
			c.p.log.WarnContext(ctx, "consumer: could not renew the lease of an operator request; trying again at the next beat",
				slog.Int64("request_id", c.r.ID), slog.Duration("lease", c.lease), slog.String("error", err.Error()))
		}
	}
}

// fenced reports whether err says the process no longer holds its
// request: claimed by another process, or cancelled.
func fenced(err error) bool {
	return errors.Is(err, operator.ErrClaimLost) || errors.Is(err, operator.ErrCancelled)
}

// next says whether the next action may start: nil, or why the carrier
// stops. A renewal of the lease sees a cancel or a lost claim at once.
func (c *carrier) next(ctx context.Context) error {
	if c.stopping.Err() != nil {
		return errStopping
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	err := c.p.ops.Renew(ctx, c.p.db, c.r, c.lease)
	switch {
	case fenced(err):
		return err
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case err != nil:
		// The action counts itself under the claim in any case.
		c.p.log.WarnContext(ctx, "consumer: could not renew the lease of an operator request; going on",
			slog.Int64("request_id", c.r.ID), slog.String("error", err.Error()))
	}
	return nil
}

// stopReason says whether an action's error err stops the carrier, and
// why: the claim lost, the request cancelled, or the action's context
// ended.
func (c *carrier) stopReason(ctx context.Context, err error) error {
	switch {
	case fenced(err):
		return err
	case ctx.Err() != nil:
		return context.Cause(ctx)
	}
	return nil
}

// end writes the end of the request after carry: see run.
func (c *carrier) end(ctx context.Context, failed bool, stopped error) error {
	p, r := c.p, c.r
	// The action's context may be cancelled; these writes must still go.
	wctx := context.WithoutCancel(ctx)
	var err error
	switch {
	case errors.Is(stopped, operator.ErrClaimLost):
		err = stopped
	case stopped != nil && !errors.Is(stopped, operator.ErrCancelled):
		// Stopping: what was done is counted; the rest is for the process
		// that takes the request up next, at once.
		if err = p.ops.Report(wctx, p.db, r, 0); err == nil {
			p.log.InfoContext(ctx, "consumer: stopping; operator request given up half done, for a process of the consumer to take up again",
				slog.Int64("request_id", r.ID), slog.Int64("applied", r.Progress.Applied), slog.Int64("discarded", r.Progress.Discarded))
			return nil
		}
	default:
		if err = p.ops.Finish(wctx, p.db, r, failed); err == nil {
			p.log.InfoContext(ctx, "consumer: operator request finished", slog.Int64("request_id", r.ID), slog.String("status", string(r.Status)),
				slog.Int64("applied", r.Progress.Applied), slog.Int64("duplicates", r.Progress.Duplicates), slog.Int64("discarded", r.Progress.Discarded),
				slog.Int64("failed", r.Progress.Failed), slog.Int64("skipped", r.Progress.Skipped), slog.Int64("drained", r.Progress.Drained))
			return nil
		}
	}
	if errors.Is(err, operator.ErrClaimLost) {
		p.log.WarnContext(ctx, "consumer: another process took over the operator request after its lease ran out; stopped before the next action, writing nothing more",
			slog.Int64("request_id", r.ID), slog.Int64("claim", r.Claim), slog.Duration("lease", c.lease), slog.String("error", err.Error()))
		return nil
	}
	return err
}

// carry carries out r, filling in its Progress and Error. It reports
// whether the request failed as a whole, and why it stopped early, if it
// did.
func (c *carrier) carry(ctx context.Context) (failed bool, stopped error) {
	p, r := c.p, c.r
	switch {
	case r.Action == operator.ResolveGap:
		r.Progress.Matched = 1
		if _, err := p.ResolveGap(ctx, ordering.Aggregate{Type: r.Letters.AggregateType, ID: r.Letters.AggregateID}); err != nil {
			if stop := c.stopReason(ctx, err); stop != nil {
				return false, stop
			}
			r.Error, r.Progress.Failed = err.Error(), 1
			return true, nil
		}
		return false, nil
	case r.LetterID != 0:
		r.Progress.Matched = 1
		if err := c.act(ctx, deadletter.Ref{ID: r.LetterID}); err != nil {
			if stop := c.stopReason(ctx, err); stop != nil {
				return false, stop
			}
			r.Error, r.Progress.Failed = err.Error(), 1
			return true, nil
		}
		return false, nil
	}
	return c.bulk(ctx)
}

// bulk carries out r over the open letters its filter matches, aggregate
// by aggregate in sequence order; a letter that fails stops its aggregate.
func (c *carrier) bulk(ctx context.Context) (failed bool, stopped error) {
	p, r := c.p, c.r
	opts := r.Letters
	opts.Consumer, opts.Status, opts.AfterID, opts.Limit = p.name, deadletter.StatusDead, 0, 0
	refs, err := p.dead.Match(ctx, p.db, &opts)
	if err != nil {
		if stop := c.stopReason(ctx, err); stop != nil {
			return false, stop
		}
		r.Error = err.Error()
		return true, nil
	}
	pr := &r.Progress
	// A request taken up again keeps what was done before (counted with
	// each action); the letters that failed or were skipped then are
	// still open and matched again.
	pr.Failed, pr.Skipped = 0, 0
	pr.Matched = pr.Applied + pr.Duplicates + pr.Discarded + int64(len(refs))
	if err := p.ops.Report(ctx, p.db, r, c.lease); fenced(err) {
		return false, err
	}
	var (
		stopAgg  = map[ordering.Aggregate]bool{}
		interval = rateInterval(r.Rate)
		next     = time.Now()
		reported = time.Now()
	)
	for _, ref := range refs {
		agg := ordering.Aggregate{Type: ref.AggregateType, ID: ref.AggregateID}
		if ref.Seq != 0 && stopAgg[agg] {
			pr.Skipped++
			continue
		}
		if err := c.pause(ctx, time.Until(next)); err != nil {
			return false, err
		}
		next = next.Add(interval)
		if err := c.next(ctx); err != nil {
			return false, err
		}
		if err := c.act(ctx, ref); err != nil {
			if stop := c.stopReason(ctx, err); stop != nil {
				return false, stop
			}
			if errors.Is(err, deadletter.ErrResolved) {
				pr.Skipped++ // resolved meanwhile by someone else
			} else {
				pr.Failed++
				if r.Error == "" {
					r.Error = err.Error()
				}
				if ref.Seq != 0 {
					stopAgg[agg] = true
				}
			}
		}
		if time.Since(reported) >= reportEvery {
			reported = time.Now()
			err := p.ops.Report(ctx, p.db, r, c.lease)
			if fenced(err) {
				return false, err
			}
			if err != nil && ctx.Err() == nil {
				p.log.WarnContext(ctx, "consumer: could not report an operator request's progress", slog.Int64("request_id", r.ID), slog.String("error", err.Error()))
			}
		}
	}
	return false, nil
}

// pause waits d, Rate's pause before the next letter; it returns why the
// carrier stops when it must stop meanwhile. The heartbeat renews the
// lease while it waits.
func (c *carrier) pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-c.stopping.Done():
		return errStopping
	case <-t.C:
		return nil
	}
}

// rateInterval is the pause between letters at rate letters per second:
// none for rate 0, and at most 1/operator.MinRate, which Submit enforces,
// for a rate stored before it did.
func rateInterval(rate float64) time.Duration {
	if rate <= 0 {
		return 0
	}
	return time.Duration(float64(time.Second) / max(rate, operator.MinRate))
}

// act replays or discards one letter for the request, then drains the
// rest of its aggregate's successors at once, so that the request's next
// letter of the aggregate finds them applied. Each transaction counts
// itself in the request (see countRequest).
func (c *carrier) act(ctx context.Context, ref deadletter.Ref) error {
	p, r := c.p, c.r
	var drained int
	switch r.Action {
	case operator.Replay:
		res, err := p.Replay(ctx, ref.ID)
		if err != nil {
			return err
		}
		drained = res.Drained
	case operator.Discard:
		n, err := p.Discard(ctx, ref.ID)
		if err != nil {
			return err
		}
		drained = n
	default:
		return fmt.Errorf("consumer: operator request %d: action %q does not act on letters", r.ID, r.Action)
	}
	if drained < drainChunk {
		return nil
	}
	agg := ordering.Aggregate{Type: ref.AggregateType, ID: ref.AggregateID}
	if ref.AggregateID == "" {
		l, err := p.dead.Get(ctx, p.db, ref.ID)
		if err != nil {
			return err
		}
		agg = ordering.Aggregate{Type: l.AggregateType, ID: l.AggregateID}
	}
	if _, err := p.drainRest(ctx, agg); err != nil {
		// The letter is done; the drainer applies the rest later, and a
		// later letter of the aggregate waits for them (ErrNotNext).
		p.log.WarnContext(ctx, "consumer: draining after an operator request's letter failed; the drainer retries", slog.Int64("request_id", r.ID),
			slog.Int64("dead_letter_id", ref.ID), slog.String("error", err.Error()))
		p.readyToDrain()
	}
	return nil
}
