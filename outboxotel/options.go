package outboxotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Options says where spans and measurements go. The zero value (or nil)
// uses the global providers and propagator of go.opentelemetry.io/otel.
type Options struct {
	// TracerProvider makes the spans. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the instruments. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator writes and reads the trace context in headers. Default
	// otel.GetTextMapPropagator(); set it to propagation.TraceContext{}
	// for W3C traceparent and tracestate whatever the global one is.
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
		out.Propagator = otel.GetTextMapPropagator()
	}
	return out
}
