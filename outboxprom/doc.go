// Package outboxprom exports the outbox's metrics to Prometheus, through
// the core's hooks, so that the core depends on no Prometheus package:
//
//   - RelayMetrics is a producer.RelayTracer for RelayConfig.Tracer:
//     events published by outcome, the lag from writing an event to its
//     delivery, claims, errors, the LISTEN session, buckets and pruning.
//   - ConsumerMetrics is a consumer.Tracer for consumer.Config.Tracer:
//     records by outcome, time per record, and the lag from writing an
//     event to applying it.
//   - HealthCollector samples what only the database (and the broker)
//     knows: the undelivered backlog and its age, dead events, a
//     consumer's open dead letters, parked records, processed keys, and
//     consumer group lag per partition. It reads at most once per interval
//     however often it is scraped, and a slow read never holds a scrape
//     longer than its timeout.
//
// Labels are bounded: topic, partition, outcome, operation, dead-letter
// reason, and consumer and group names from configuration; never a key,
// an aggregate or an event id. Every metric and label name is in names.go;
// README.md says what each means and which to alert on.
//
// Each of RelayMetrics and ConsumerMetrics registers its metrics once on
// the registerer it is given: one RelayMetrics per registry (wrap the
// registerer with prometheus.WrapRegistererWith to run several relays in
// one process), and one ConsumerMetrics per consumer name.
//
// A process that serves a fleet of shards registers each shard's
// collectors through ForShard(reg, shard.Name): every series then carries
// a shard label, and the alert rules in monitoring/ fire per shard.
package outboxprom
