// Package producer is the sending half of the transactional outbox: Write
// puts events into an outbox table inside the caller's own transaction, and
// a Relay publishes the committed ones to Kafka.
//
// # Guarantees
//
// An event exists if and only if the transaction that wrote it commits.
// Every committed event is published at least once, whatever crashes: a row
// stays undelivered until the broker acknowledged it and the relay marked
// it, and the lease on a claimed row runs out if its relay dies. Per
// aggregate, the relay never puts seq n+1 on the wire before seq n was
// acknowledged; several relay instances share the work without breaking
// that. An event the broker refuses for good (too large, invalid topic, not
// authorised) moves to the dead events after [RelayConfig.MaxAttempts] and,
// by default, holds the later events of its aggregate until it is replayed
// or discarded; it never blocks other aggregates and is never dropped.
//
// Delivery is at least once, not exactly once: a relay that dies between
// the broker's acknowledgement and its mark publishes those events again.
// Consumers deduplicate on the idempotency-key header (the consumer package
// does it in the same database transaction as the effect).
//
// # Failure model
//
// The relay holds no transaction across a broker call: a claim leases rows
// and commits; publishing happens outside any transaction; the outcome is
// recorded in one short transaction. Database or broker outages are logged
// and retried with backoff; Run returns only when its context ends.
//
// A relay that dies (or loses its database session) leaves its claimed
// rows leased for up to [RelayConfig.Lease]. The relay that takes their
// buckets over claims the rest of those buckets at once and holds the
// aggregates of the leased rows until the leases end, so that their later
// events never go out first; it logs the hold at WARN and [Relay.Health]
// lists it. A claim also holds back an aggregate behind an earlier row it
// cannot lock or that is leased.
//
// Sequence numbers are allocated in the writer's transaction under a row
// lock on the aggregate's sequences row, so a second writer of the same
// aggregate waits until the first commits or rolls back: sequence order is
// commit order, gapless. Keep such transactions short.
//
// LISTEN and session advisory locks need a real session: behind PgBouncer in
// transaction mode, set [RelayConfig.SessionConfig] to a direct connection.
//
// # Reading and resolving
//
// An Inspector, built once from any outbox.DB and the schema, answers what
// an operator or a monitoring agent asks: the schema's Health, its Dispatch
// mode, its Relays and its dead events. Replay and Discard of a dead event
// are DeadEvents', which take the database handle per call so that a
// resolution commits in the caller's transaction, with its audit row.
package producer
