package outboxotel

import (
	"context"

	"go.opentelemetry.io/otel/propagation"

	"github.com/d419a114/outbox/producer"
)

// Propagator is a producer.Propagator: set it as WriterConfig.Propagator
// and Write stores the trace context of its ctx in each event's headers
// (W3C traceparent and tracestate unless Options.Propagator or the global
// propagator says otherwise).
type Propagator struct{ p propagation.TextMapPropagator }

var _ producer.Propagator = Propagator{}

// NewPropagator returns a Propagator writing with opts' propagator.
func NewPropagator(opts *Options) Propagator {
	return Propagator{p: opts.withDefaults().Propagator}
}

// Inject writes ctx's trace context into h.
func (p Propagator) Inject(ctx context.Context, h map[string]string) {
	p.p.Inject(ctx, propagation.MapCarrier(h))
}
