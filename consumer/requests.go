package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/ordering"
)

// requestLease is how long a claimed request stays the claiming process's
// without a report; a process that dies leaves it to another after this.
const requestLease = 30 * time.Second

// reportEvery is how often a bulk request writes its progress.
const reportEvery = time.Second

// ServeRequests carries out the operator requests (package operator)
// addressed to the consumer until ctx ends: it looks for them every
// Config.RequestPoll and, when the Processor's db is a *pgxpool.Pool, as
// soon as one is submitted (on a connection of its own, LISTENing on
// operator.Channel). Consumer.Run calls it; a poll loop of one's own
// around Process should run it beside the loop. It returns ctx's error.
//
// A request is carried out through Replay, Discard and ResolveGap, with
// the request's requester as the actor of their audit rows. A request
// that was running when its process stopped is taken up again once its
// lease runs out; a bulk one then acts on the letters still open.
func (p *Processor) ServeRequests(ctx context.Context) error {
	poll := p.cfg.RequestPoll
	if poll < 0 {
		poll = time.Second
	}
	wake := make(chan struct{}, 1)
	if pool, ok := p.db.(*pgxpool.Pool); ok {
		go p.listenRequests(ctx, pool, wake)
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
			return ctx.Err()
		case <-t.C:
		case <-wake:
		}
	}
}

// listenRequests signals wake for each notification on the schema's
// operator channel naming this consumer, and after each (re)connect. It
// returns when ctx ends.
func (p *Processor) listenRequests(ctx context.Context, pool *pgxpool.Pool, wake chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	for ctx.Err() == nil {
		err := p.listenOnce(ctx, pool, signal)
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

func (p *Processor) listenOnce(ctx context.Context, pool *pgxpool.Pool, signal func()) error {
	conn, err := p.requestSession(ctx, pool)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "LISTEN "+p.ops.Channel()); err != nil {
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
// there was one.
func (p *Processor) serveOne(ctx context.Context) (bool, error) {
	r, err := p.ops.Claim(ctx, p.db, p.name, requestLease)
	if err != nil || r == nil {
		return false, err
	}
	p.log.InfoContext(ctx, "consumer: carrying out an operator request", slog.Int64("request_id", r.ID),
		slog.String("action", string(r.Action)), slog.String("requested_by", r.RequestedBy))
	actx := withRequest(operator.WithActor(ctx, r.RequestedBy), r.ID)
	failed := p.carry(actx, r)
	if ctx.Err() != nil {
		// Stopping: the request stays running until its lease runs out,
		// then a process takes it up again.
		return false, p.ops.Report(context.WithoutCancel(ctx), p.db, r, requestLease)
	}
	if err := p.ops.Finish(ctx, p.db, r, failed); err != nil {
		return true, err
	}
	p.log.InfoContext(ctx, "consumer: operator request finished", slog.Int64("request_id", r.ID), slog.String("status", string(r.Status)),
		slog.Int64("applied", r.Progress.Applied), slog.Int64("discarded", r.Progress.Discarded), slog.Int64("failed", r.Progress.Failed),
		slog.Int64("drained", r.Progress.Drained))
	return true, nil
}

// carry carries out r, filling in its Progress and Error, and reports
// whether it failed as a whole.
func (p *Processor) carry(ctx context.Context, r *operator.Request) bool {
	switch {
	case r.Action == operator.ResolveGap:
		r.Progress.Matched = 1
		n, err := p.ResolveGap(ctx, ordering.Aggregate{Type: r.Letters.AggregateType, ID: r.Letters.AggregateID})
		if err != nil {
			r.Error, r.Progress.Failed = err.Error(), 1
			return true
		}
		r.Progress.Drained = int64(n)
		return false
	case r.LetterID != 0:
		r.Progress.Matched = 1
		if err := p.act(ctx, r, deadletter.Ref{ID: r.LetterID}); err != nil {
			r.Error, r.Progress.Failed = err.Error(), 1
			return true
		}
		return false
	}
	return p.bulk(ctx, r)
}

// bulk carries out r over the open letters its filter matches, aggregate
// by aggregate in sequence order; a letter that fails stops its aggregate.
func (p *Processor) bulk(ctx context.Context, r *operator.Request) bool {
	opts := r.Letters
	opts.Consumer, opts.Status, opts.AfterID, opts.Limit = p.name, deadletter.StatusDead, 0, 0
	refs, err := p.dead.Match(ctx, p.db, &opts)
	if err != nil {
		r.Error = err.Error()
		return true
	}
	pr := &r.Progress
	// A request taken up again keeps what its first run did; the letters
	// that failed or were skipped then are still open and matched again.
	pr.Failed, pr.Skipped = 0, 0
	pr.Matched = pr.Applied + pr.Duplicates + pr.Discarded + int64(len(refs))
	var (
		stopped  = map[ordering.Aggregate]bool{}
		interval time.Duration
		next     = time.Now()
		reported = time.Now()
	)
	if r.Rate > 0 {
		interval = time.Duration(float64(time.Second) / r.Rate)
	}
	for _, ref := range refs {
		agg := ordering.Aggregate{Type: ref.AggregateType, ID: ref.AggregateID}
		if ref.Seq != 0 && stopped[agg] {
			pr.Skipped++
			continue
		}
		if err := sleep(ctx, time.Until(next)); err != nil {
			return false
		}
		next = next.Add(interval)
		if err := p.act(ctx, r, ref); err != nil {
			if ctx.Err() != nil {
				return false
			}
			if errors.Is(err, deadletter.ErrResolved) {
				pr.Skipped++ // resolved meanwhile by someone else
			} else {
				pr.Failed++
				if r.Error == "" {
					r.Error = err.Error()
				}
				if ref.Seq != 0 {
					stopped[agg] = true
				}
			}
		}
		if time.Since(reported) >= reportEvery {
			reported = time.Now()
			if err := p.ops.Report(ctx, p.db, r, requestLease); err != nil && ctx.Err() == nil {
				p.log.WarnContext(ctx, "consumer: could not report an operator request's progress", slog.Int64("request_id", r.ID), slog.String("error", err.Error()))
			}
		}
	}
	return false
}

// act replays or discards one letter for r, then drains the rest of its
// aggregate's successors at once, so that the request's next letter of the
// aggregate finds them applied.
func (p *Processor) act(ctx context.Context, r *operator.Request, ref deadletter.Ref) error {
	var drained int
	switch r.Action {
	case operator.Replay:
		res, err := p.Replay(ctx, ref.ID)
		if err != nil {
			return err
		}
		if res.Outcome == Duplicate {
			r.Progress.Duplicates++
		} else {
			r.Progress.Applied++
		}
		drained = res.Drained
	case operator.Discard:
		n, err := p.Discard(ctx, ref.ID)
		if err != nil {
			return err
		}
		r.Progress.Discarded++
		drained = n
	default:
		return fmt.Errorf("consumer: operator request %d: action %q does not act on letters", r.ID, r.Action)
	}
	r.Progress.Drained += int64(drained)
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
	n, err := p.drainRest(ctx, agg)
	r.Progress.Drained += int64(n)
	if err != nil {
		// The letter is done; the drainer applies the rest later, and a
		// later letter of the aggregate waits for them (ErrNotNext).
		p.log.WarnContext(ctx, "consumer: draining after an operator request's letter failed; the drainer retries", slog.Int64("request_id", r.ID),
			slog.Int64("dead_letter_id", ref.ID), slog.String("error", err.Error()))
		p.readyToDrain()
	}
	return nil
}
