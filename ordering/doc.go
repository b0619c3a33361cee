// Package ordering is the vocabulary of per-aggregate ordering on the
// consumer side: the names a user configures, reads and matches on. The
// checking itself is consumer.Processor's.
//
// The writer numbers each aggregate's events 1, 2, 3, ... without gaps
// (outbox.HeaderAggregateSeq). For each (consumer, aggregate) the positions
// table keeps the last sequence applied. A record with sequence s is in
// order (s == last+1: it is applied and the position moves to s in the
// same transaction as the effect), a duplicate (s <= last: skipped), or
// ahead of a gap (s > last+1: one or more predecessors are missing). The
// GapPolicy decides about the last: GapPark (default) stores the record in
// the parked table, its offset can be committed, and it is applied when
// the gap fills; GapFail stops the partition until the missing record
// arrives (*GapError); GapIgnore applies it anyway and reports the gap.
//
// When the missing record is applied, the parked successors are applied in
// order in the same transaction. A record that is dead-lettered holds its
// aggregate: its successors are parked behind it whatever the gap policy,
// so a poison message never breaks order, and other aggregates are never
// blocked. Operators see open gaps (OpenGap, paged by GapOpts into a
// GapPage) and the records parked behind them (Parked) through
// consumer.Inspector, and resolve a gap with consumer.Processor.ResolveGap,
// which gives up on the missing sequence numbers and lets the parked
// records drain.
//
// # First sight of an aggregate
//
// An aggregate with no position whose first record has s > 1 is a gap from
// 0 by default (FirstSeenStrict): the record is parked until 1..s-1 have
// been applied, and the gap shows in the consumer's gaps. The alternative,
// FirstSeenBaseline, applies it and takes s as the starting point; but then
// an earlier record that arrives later (a second relay, a retried publish,
// a producer without ordered delivery) is below the position and skipped as
// a duplicate: it is lost without a trace. Strict never loses a record; its
// cost is visible, not silent: a consumer that starts reading a topic after
// the first events of some aggregates are gone (topic retention, a start at
// the latest offset) parks those aggregates until an operator resolves
// their gaps. Such consumers should choose FirstSeenBaseline.
//
// Records without a sequence bypass ordering altogether.
package ordering
