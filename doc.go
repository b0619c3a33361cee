// Package outbox holds what the SDK's halves share: the wire contract (the
// Kafka headers the relay writes and the consumer reads) and the database
// migrations for both sides.
//
// The SDK makes events between services reliable on PostgreSQL and Kafka.
// The producer package writes events into an outbox table inside the
// caller's own transaction, so an event exists if and only if that
// transaction commits, and a relay publishes them to Kafka at least once,
// in per-aggregate order. The consumer side (packages consumer, dedupe,
// ordering and deadletter) applies each event's effect once per consumer,
// in the same database transaction as the effect, in per-aggregate order,
// and sets poison messages aside without blocking other aggregates.
//
// "Once" is exact only within the consumer's database and for as long as the
// processed key is retained: an email sent or an HTTP call made by a
// handler can still happen more than once.
//
// Call Migrate at start-up, or apply the files from Migrations with your own
// migration tool.
package outbox
