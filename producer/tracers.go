package producer

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Tracers returns one RelayTracer that calls each of ts, for a relay
// traced and measured at once (outboxotel's tracer and outboxprom's
// metrics, say). Each optional interface (ClaimTracer, RebalanceTracer,
// ListenerTracer, PruneTracer) reaches the tracers of ts that implement
// it, and the relay calls it only when one of them does. Starts run in
// the order of ts, each in the context the one before returned, and the
// work runs in the last one's; ends run in the reverse order, each with
// the context its own start returned. Nil tracers are left out, and a
// result of Tracers among ts counts as its own tracers. Tracers returns
// nil for no tracer, and the tracer itself for one.
func Tracers(ts ...RelayTracer) RelayTracer {
	var m multiRelayTracer
	for _, t := range ts {
		m.add(t)
	}
	switch len(m.publish) {
	case 0:
		return nil
	case 1:
		return m.publish[0]
	}
	return &m
}

// multiRelayTracer is what Tracers returns: its tracers under each
// interface they implement.
type multiRelayTracer struct {
	publish   []RelayTracer
	claim     []ClaimTracer
	rebalance []RebalanceTracer
	listener  []ListenerTracer
	prune     []PruneTracer
}

var (
	_ ClaimTracer     = (*multiRelayTracer)(nil)
	_ RebalanceTracer = (*multiRelayTracer)(nil)
	_ ListenerTracer  = (*multiRelayTracer)(nil)
	_ PruneTracer     = (*multiRelayTracer)(nil)
)

func (m *multiRelayTracer) add(t RelayTracer) {
	switch t := t.(type) {
	case nil:
		return
	case *multiRelayTracer:
		for _, inner := range t.publish {
			m.add(inner)
		}
		return
	}
	m.publish = append(m.publish, t)
	if c, ok := t.(ClaimTracer); ok {
		m.claim = append(m.claim, c)
	}
	if r, ok := t.(RebalanceTracer); ok {
		m.rebalance = append(m.rebalance, r)
	}
	if l, ok := t.(ListenerTracer); ok {
		m.listener = append(m.listener, l)
	}
	if p, ok := t.(PruneTracer); ok {
		m.prune = append(m.prune, p)
	}
}

// startedKey keys, in the context a multiRelayTracer's start returns, the
// contexts its tracers' starts returned, one per tracer.
type startedKey struct{ m *multiRelayTracer }

// started returns the context each tracer's start returned, from ctx that
// the start of m returned (or one derived from it); ctx itself for each
// when it is not one.
func started(ctx context.Context, key any, n int) []context.Context {
	if ctxs, ok := ctx.Value(key).([]context.Context); ok && len(ctxs) == n {
		return ctxs
	}
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctxs[i] = ctx
	}
	return ctxs
}

// TracePublishStart calls each tracer's TracePublishStart.
func (m *multiRelayTracer) TracePublishStart(ctx context.Context, recs []*kgo.Record) context.Context {
	ctxs := make([]context.Context, len(m.publish))
	for i, t := range m.publish {
		ctx = t.TracePublishStart(ctx, recs)
		ctxs[i] = ctx
	}
	return context.WithValue(ctx, startedKey{m}, ctxs)
}

// TracePublishEnd calls each tracer's TracePublishEnd, the last started
// first.
func (m *multiRelayTracer) TracePublishEnd(ctx context.Context, recs []*kgo.Record, res PublishResult, err error) {
	ctxs := started(ctx, startedKey{m}, len(m.publish))
	for i := len(m.publish) - 1; i >= 0; i-- {
		m.publish[i].TracePublishEnd(ctxs[i], recs, res, err)
	}
}

// claimStartedKey is startedKey for claims, which may run inside a
// publish's context.
type claimStartedKey struct{ m *multiRelayTracer }

// TraceClaimStart calls TraceClaimStart of each tracer that is a
// ClaimTracer.
func (m *multiRelayTracer) TraceClaimStart(ctx context.Context) context.Context {
	ctxs := make([]context.Context, len(m.claim))
	for i, t := range m.claim {
		ctx = t.TraceClaimStart(ctx)
		ctxs[i] = ctx
	}
	return context.WithValue(ctx, claimStartedKey{m}, ctxs)
}

// TraceClaimEnd calls TraceClaimEnd of each tracer that is a ClaimTracer,
// the last started first.
func (m *multiRelayTracer) TraceClaimEnd(ctx context.Context, n int, err error) {
	ctxs := started(ctx, claimStartedKey{m}, len(m.claim))
	for i := len(m.claim) - 1; i >= 0; i-- {
		m.claim[i].TraceClaimEnd(ctxs[i], n, err)
	}
}

// TraceRebalance calls TraceRebalance of each tracer that is a
// RebalanceTracer.
func (m *multiRelayTracer) TraceRebalance(ctx context.Context, owned, buckets int, err error) {
	for _, t := range m.rebalance {
		t.TraceRebalance(ctx, owned, buckets, err)
	}
}

// TraceListener calls TraceListener of each tracer that is a
// ListenerTracer.
func (m *multiRelayTracer) TraceListener(ctx context.Context, up bool, err error) {
	for _, t := range m.listener {
		t.TraceListener(ctx, up, err)
	}
}

// TracePrune calls TracePrune of each tracer that is a PruneTracer.
func (m *multiRelayTracer) TracePrune(ctx context.Context, res PruneResult, err error) {
	for _, t := range m.prune {
		t.TracePrune(ctx, res, err)
	}
}
