package consumer

import "context"

// PruneKeys deletes the consumer's processed keys older than
// [Config.KeyRetention], in bounded batches, and returns how many it deleted.
// [Consumer.Run] calls it every [Config.PruneInterval]; a poll loop of one's
// own should call it as well.
func (p *Processor) PruneKeys(ctx context.Context) (int64, error) {
	return p.dedupe.Prune(ctx, p.db)
}
