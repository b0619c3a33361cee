// Package outboxotel traces and measures the outbox with OpenTelemetry:
// a Propagator for producer.WriterConfig stores the writing request's
// trace context with each event; a RelayTracer for producer.RelayConfig
// gives each published batch a send span linked to the spans that wrote
// its events; a ConsumerTracer for consumer.Config gives each record a
// process span whose parent is the context the record carries, with the
// handler's transaction inside it. Span and attribute names follow the
// OpenTelemetry semantic conventions for messaging on Kafka; all of them
// are in attributes.go.
//
// It is a module of its own, so that the core depends on no OpenTelemetry
// package.
package outboxotel
