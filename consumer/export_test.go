package consumer

import (
	"context"
	"time"
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
