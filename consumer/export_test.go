package consumer

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/ordering"
)

// ServeOne claims one operator request and carries it out, for tests that
// must run a request at a point of their choosing.
var ServeOne = (*Processor).serveOne

// SetRequestLease makes p claim operator requests under lease, and run
// beat (when not nil) before each renewal of its heartbeat, which a test
// blocks to stall the heartbeat as a paused process would.
func SetRequestLease(p *Processor, lease time.Duration, beat func(context.Context)) {
	p.requests = requestTuning{lease: lease, beat: beat}
}

// Parse reads rec as the Processor does, without a Config.KeyFunc or a
// value limit.
func Parse(rec *kgo.Record) (*Message, error) { return parse(rec, nil, 0) }

// GapOf reads agg's open gap as ResolveGap does, nil when it has none: it
// also finds an aggregate held only by a dead letter beyond its next
// sequence, which Inspector.Gaps leaves to the letters.
func GapOf(ctx context.Context, p *Processor, agg ordering.Aggregate) (*ordering.OpenGap, error) {
	return p.ordering.Gap(ctx, p.db, agg)
}
