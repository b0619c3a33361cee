// Package move moves aggregates from one shard to another without a gap,
// a reused sequence number or a reorder of their events.
//
// A move takes five steps, each one transaction on one shard, each
// recorded in the moves table of that shard (migration 0013):
//
//  0. Reserve on the target: writes of the aggregates there are refused
//     with a *producer.MovedError naming the source (Arriving set), so
//     that no writer sent there by step 1 numbers an aggregate on its own
//     before step 2. The target must not have numbered the aggregates
//     itself: each is new there or moved away from it earlier
//     (*ConflictError otherwise). Nor may the source have never numbered
//     it, unless [Config.AllowNew]: a move knows only its two shards, and
//     the aggregate's events could be on a third.
//  1. Close on the source: each aggregate's sequence row is locked (the
//     lock that orders its writers), its last sequence read and the row
//     marked moved to the target. From then on producer.Writer.Write of
//     the aggregate on the source writes nothing and returns a
//     *producer.MovedError naming the target.
//  2. Open on the target: each aggregate's sequence is set to the
//     source's last one and marked arriving. Between steps 1 and 2 (one
//     transaction) neither shard takes the aggregates' writes; retry. Writes there go on at the
//     next number, but their events are inserted held (failed once, next
//     attempt never, last_error "held: arriving from shard ..."), which
//     the relay's claim leaves alone.
//  3. Drain: wait until the source's relay delivered every event of the
//     aggregates up to the last sequence. A dead event of one of them
//     stops the move with a *BlockedError: replay or discard it, then
//     call Resume.
//  4. Release on the target: the aggregates stop arriving and their held
//     events become due at once, in one transaction that takes each
//     sequence row's lock first, so a write racing the release is either
//     held and released by it, or written after it and due at once.
//
// All aggregates of a move take each step together. Every step is
// idempotent: Run with the same [Config.ID], or Resume, after a crash at
// any point finishes the move; Resume of a move whose target was never
// opened rolls it back instead, reopening the aggregates on the source
// (the target keeps refusing them, naming the source).
//
// While a move is under way the held events count as undelivered in the
// target's health view, with their age: an operator sees what waits, and
// Status says why.
package move
