package consumer

import (
	"context"
	"sync/atomic"
)

// PruneKeys deletes the consumer's processed keys older than
// [Config.KeyRetention], in bounded batches, and returns how many it deleted.
// [Consumer.Run] calls it every [Config.PruneInterval]; a poll loop of one's
// own should call it as well. A routing Processor prunes every target, all
// at once.
func (p *Processor) PruneKeys(ctx context.Context) (int64, error) {
	if p.route != nil {
		var n atomic.Int64
		err := p.route.each(func(t *Processor) error {
			d, err := t.PruneKeys(ctx)
			n.Add(d)
			return err
		})
		return n.Load(), err
	}
	return p.dedupe.Prune(ctx, p.db)
}
