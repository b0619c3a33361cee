package producer

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Propagator copies the trace context of the request that writes events
// into their headers, so that the relay publishes it with them and a
// consumer's span continues the request's trace. It keeps the core free of
// any tracing library: an adapter implements it (for W3C Trace Context, it
// sets traceparent and tracestate).
type Propagator interface {
	// Inject adds the trace context of ctx to headers.
	Inject(ctx context.Context, headers map[string]string)
}

// RelayTracer observes a relay's publishing, for tracing and metrics
// adapters, in the manner of pgx's QueryTracer: a start that returns the
// context to go on in, and an end with the outcome. NewRelay finds out once
// whether it also implements ClaimTracer, RebalanceTracer, ListenerTracer
// and PruneTracer. Implementations must be safe for concurrent use and fast.
// Tracers combines several into one.
type RelayTracer interface {
	// TracePublishStart is called before a claimed batch is sent, with
	// its records as they will be produced (the event's headers, and so
	// the trace context Write stored, among theirs). The records are
	// produced in the context it returns.
	TracePublishStart(ctx context.Context, recs []*kgo.Record) context.Context
	// TracePublishEnd is called once the batch's outcome is recorded in
	// the database, or recording it failed (err not nil; the rows are then
	// published again after their lease).
	TracePublishEnd(ctx context.Context, recs []*kgo.Record, res PublishResult, err error)
}

// PublishResult counts what became of a published batch's events.
type PublishResult struct {
	// Delivered were acknowledged by the broker and marked delivered.
	Delivered int
	// Failed were not acknowledged and count an attempt; they are
	// published again after a backoff. Their aggregates' later events in
	// the batch are released without counting one, and are in neither.
	Failed int
	// Dead are the failed ones that exhausted their attempts and moved to
	// the dead events.
	Dead int
}

// ClaimTracer is a RelayTracer that also observes claims: n events claimed,
// or the claim's error.
type ClaimTracer interface {
	TraceClaimStart(ctx context.Context) context.Context
	TraceClaimEnd(ctx context.Context, n int, err error)
}

// RebalanceTracer is a RelayTracer that also observes the rebalances of
// buckets: how many this relay owns afterwards, of how many, or the
// rebalance's error.
type RebalanceTracer interface {
	TraceRebalance(ctx context.Context, owned, buckets int, err error)
}

// ListenerTracer is a RelayTracer that also observes the LISTEN session
// that wakes the relay: up when it is listening, down with the error that
// ended it.
type ListenerTracer interface {
	TraceListener(ctx context.Context, up bool, err error)
}

// PruneTracer is a RelayTracer that also observes the relay's pruning.
type PruneTracer interface {
	TracePrune(ctx context.Context, res PruneResult, err error)
}

// relayTracers holds the relay's tracer under each interface it
// implements; a nil field means not traced.
type relayTracers struct {
	publish   RelayTracer
	claim     ClaimTracer
	rebalance RebalanceTracer
	listener  ListenerTracer
	prune     PruneTracer
}

func newRelayTracers(t RelayTracer) relayTracers {
	if t == nil {
		return relayTracers{}
	}
	out := relayTracers{publish: t}
	if m, ok := t.(*multiRelayTracer); ok {
		// Tracers implements every optional interface; only those its
		// tracers implement are traced.
		if len(m.claim) > 0 {
			out.claim = m
		}
		if len(m.rebalance) > 0 {
			out.rebalance = m
		}
		if len(m.listener) > 0 {
			out.listener = m
		}
		if len(m.prune) > 0 {
			out.prune = m
		}
		return out
	}
	out.claim, _ = t.(ClaimTracer)
	out.rebalance, _ = t.(RebalanceTracer)
	out.listener, _ = t.(ListenerTracer)
	out.prune, _ = t.(PruneTracer)
	return out
}
