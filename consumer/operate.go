package consumer

import (
	"context"
	"fmt"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/ordering"
)

// Gaps lists the consumer's open gaps, oldest first: each aggregate with
// parked records, the sequence it waits for, how many wait and since when,
// and the lowest open dead letter inside the hole when one is there.
// Resolve one with ResolveGap, or with Replay or Discard of its letter.
func (p *Processor) Gaps(ctx context.Context) ([]ordering.OpenGap, error) {
	return p.ordering.Gaps(ctx, p.db)
}

// Position returns the last sequence of agg the consumer applied, and
// false when it has applied none.
func (p *Processor) Position(ctx context.Context, agg ordering.Aggregate) (int64, bool, error) {
	return p.ordering.Position(ctx, p.db, agg)
}

// DeadLetters lists the consumer's dead letters that match opts, lowest id
// first; opts.Consumer is ignored (it is this consumer). Page with
// opts.AfterID.
func (p *Processor) DeadLetters(ctx context.Context, opts *deadletter.ListOpts) ([]*deadletter.Letter, error) {
	o := deadletter.ListOpts{}
	if opts != nil {
		o = *opts
	}
	o.Consumer = p.name
	return p.dead.List(ctx, p.db, &o)
}

// DeadLetter returns the dead letter id, an error wrapping
// outbox.ErrNotFound when there is none, and ErrWrongConsumer when it is
// another consumer's.
func (p *Processor) DeadLetter(ctx context.Context, id int64) (*deadletter.Letter, error) {
	l, err := p.dead.Get(ctx, p.db, id)
	if err != nil {
		return nil, err
	}
	if l.Consumer != p.name {
		return nil, fmt.Errorf("consumer: dead letter %d belongs to consumer %q, not %q: %w", id, l.Consumer, p.name, ErrWrongConsumer)
	}
	return l, nil
}

// PruneKeys deletes the consumer's processed keys older than
// Config.KeyRetention, in bounded batches, and returns how many it deleted.
// Consumer.Run calls it every Config.PruneInterval; a poll loop of one's
// own should call it as well.
func (p *Processor) PruneKeys(ctx context.Context) (int64, error) {
	return p.dedupe.Prune(ctx, p.db)
}
