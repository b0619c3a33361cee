// Package dedupe is the consumer's idempotency store: one row per
// (consumer, key) in the processed_keys table, claimed inside the caller's
// transaction.
//
// Claiming inserts the key with INSERT ... ON CONFLICT DO NOTHING, so the
// primary key decides: of two transactions racing on one key, exactly one
// claims it and the other learns it is a duplicate (after the first commits)
// without an error. There is no read-then-write window. Because the claim is
// part of the caller's transaction, the effect and the claim commit or roll
// back together: an effect is applied once per consumer.
//
// "Once" holds only within that database and only for as long as the key is
// retained. Prune removes keys older than the retention window (default 7
// days); a record redelivered after its key was pruned is applied again. Keep
// the window longer than the longest path by which a record can come back:
// the topic's retention, offset resets, and dead-letter replays. Side effects
// outside the database (an email, an HTTP call) are not covered.
//
// The package needs no Kafka: any message with a stable key can be
// deduplicated with it.
package dedupe
