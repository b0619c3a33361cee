// Package consumer applies Kafka records to a PostgreSQL database so that
// each record's effect happens once per consumer, in per-aggregate order,
// and a poison record is set aside without blocking anything else.
//
// A Handler does the record's work inside a pgx.Tx that the package opens.
// In that same transaction the record's idempotency key is claimed (package
// dedupe), its aggregate's position is moved (package ordering), and, when
// the record releases parked successors, those are applied too. Everything
// commits together or not at all, so:
//
//   - a redelivered record (the producer's at-least-once, an offset commit
//     lost in a crash, an offset reset) finds its key claimed and is
//     skipped: its effect is applied once, within the consumer's database
//     and for as long as the key is retained (Config.KeyRetention, default
//     7 days). Effects outside that database (emails, HTTP calls) can
//     happen more than once; make them idempotent on Message.IdempotencyKey.
//   - a record that arrives ahead of a gap in its aggregate's sequence is
//     parked and applied when the gap fills (or per Config.GapPolicy).
//   - a handler error is retried with backoff up to Config.MaxAttempts
//     (Permanent errors are not retried); a panic is recovered and counts
//     as an error. Then the record goes to the dead-letter table, in its
//     own transaction, with the error and the panic's stack, and the later
//     records of its aggregate are parked behind it until it is replayed or
//     discarded. Other aggregates keep flowing.
//   - a record that cannot be used at all (no idempotency key, a malformed
//     sequence, a value above Config.MaxValueBytes) is dead-lettered at once
//     with the reason.
//
// Records with no sequence header bypass ordering; dedupe still applies.
// Records from other producers (Debezium's outbox event router, plain
// clients) work: the key is taken from the idempotency-key header, then
// the event id, then Debezium's id header, then [Config.KeyFunc]. Such
// records are the producer's contract, not the SDK's, and three of their
// edges are worth knowing:
//
//   - Debezium's id header is only as unique as the outbox table's id
//     column. When it is not unique per event (an aggregate's id, a
//     per-tenant counter), every event after the first with that id is
//     skipped as a duplicate, and nothing can tell it from a redelivery.
//     The Processor logs a WARN naming the fallback the first time a
//     topic's record is skipped on a key from id, and then at most every
//     ten minutes per topic with the count in between; set the
//     outbox-idempotency-key header or Config.KeyFunc to take the key
//     from elsewhere.
//   - A sequence header that cannot be read (not a number, below 1,
//     empty) dead-letters the record without holding its aggregate: there
//     is no position to hold it at. Its later records are applied without
//     waiting for it, and discarding the letter releases nothing; the
//     letter's error says so.
//   - A tombstone (a null value and no headers: a compacted topic's
//     delete marker) has no key and is dead-lettered with ErrTombstone.
//     To apply tombstones, give them a key with Config.KeyFunc (the
//     handler sees Value nil); to keep them out, turn them off at the
//     source (Debezium's tombstones.on.delete=false).
//
// Two ways to run it:
//
//   - Handle returns a Processor for a poll loop you already have: call
//     Process (or ProcessBatch) per partition in offset order and mark an
//     offset for commit only after it returned no error.
//   - New returns a Consumer that owns the poll loop of a franz-go consumer
//     group (create the client with ClientOpts). Each partition flows on
//     its own lane, never waiting for another's, and Config.Concurrency
//     lets several aggregates of one partition be applied at once.
//
// Batch mode (ProcessBatch, or [Config.BatchSize] above 1 for the Consumer)
// applies several records of a partition in one transaction with the same results as
// one at a time: anything off the happy path (a handler error, a gap)
// rolls the batch back and runs its records one by one. A handler that also
// implements BatchHandler gets a batch's messages in one HandleBatch call,
// so that it can write their effects with one multi-row statement instead
// of a round trip each; when HandleBatch fails, no record is blamed and the
// records are applied one by one through Handle, which dead-letters a
// failing record alone.
//
// What a consumer has set aside or kept (its dead letters, gaps, parked
// records, positions, health and running members) is read through an
// Inspector, built from any outbox.DB and the schema: the operator's and
// the dashboard's view. The verbs that change it (Replay, Discard,
// ResolveGap, DrainReady, PruneKeys) are the Processor's, and a running
// Consumer carries out the same verbs when another process requests them
// (package operator).
//
// Offsets are committed after the database commit, so a crash in between
// redelivers records that are already applied; dedupe skips them. The
// database is the source of truth, Kafka offsets only an optimisation.
package consumer
