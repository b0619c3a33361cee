package outboxotel

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Options says where spans and measurements go. The zero value (or nil)
// uses the global providers of go.opentelemetry.io/otel, and its global
// propagator once one is set, W3C Trace Context until then: with no
// options at all, events carry traceparent and traces link.
type Options struct {
	// TracerProvider makes the spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the instruments. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator writes and reads the trace context in headers. Default
	// otel.GetTextMapPropagator() when a global propagator is set (one
	// with fields, at the time of each call), else
	// propagation.TraceContext{} (W3C traceparent and tracestate): the
	// global default of go.opentelemetry.io/otel writes nothing, and
	// would leave every consumer's trace unlinked to its writer's. Set
	// it to propagation.NewCompositeTextMapPropagator() to write and read
	// no trace context.
	Propagator propagation.TextMapPropagator
	// LinkToProducer makes a record's process span a new trace linked to
	// the span that wrote the event, instead of its child. Default false.
	LinkToProducer bool
}

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.TracerProvider == nil {
		out.TracerProvider = otel.GetTracerProvider()
	}
	if out.MeterProvider == nil {
		out.MeterProvider = otel.GetMeterProvider()
	}
	if out.Propagator == nil {
		out.Propagator = globalOrTraceContext{}
	}
	return out
}

// globalOrTraceContext is the default propagator: the global one when it
// has been set, W3C Trace Context until then. It asks at each call, so a
// global propagator set after the tracers were made is used.
type globalOrTraceContext struct{}

func (globalOrTraceContext) pick() propagation.TextMapPropagator {
	if g := otel.GetTextMapPropagator(); len(g.Fields()) > 0 {
		return g
	}
	return propagation.TraceContext{}
}

func (p globalOrTraceContext) Inject(ctx context.Context, c propagation.TextMapCarrier) {
	p.pick().Inject(ctx, c)
}

func (p globalOrTraceContext) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	return p.pick().Extract(ctx, c)
}

func (p globalOrTraceContext) Fields() []string { return p.pick().Fields() }
