// Package ordering checks per-aggregate sequence numbers on the consumer
// side and holds back records that arrive ahead of their turn.
//
// The writer numbers each aggregate's events 1, 2, 3, ... without gaps
// (outbox.HeaderAggregateSeq). For each (consumer, aggregate) the positions
// table keeps the last sequence applied. A record with sequence s gets one
// of three verdicts:
//
//   - InOrder (s == last+1): apply it; the position moves to s in the same
//     transaction as the effect.
//   - Duplicate (s <= last): it was applied before; skip it.
//   - Gap (s > last+1): one or more predecessors are missing. The GapPolicy
//     decides: GapPark (default) stores the record in the parked table, its
//     offset can be committed, and it is applied when the gap fills; GapFail
//     stops the partition until the missing record arrives; GapIgnore
//     applies it anyway and reports the gap.
//
// When the missing record is applied, Drain applies the parked successors in
// order in the same transaction. A record that is dead-lettered holds its
// aggregate (Hold): its successors are parked behind it whatever the gap
// policy, so a poison message never breaks order, and other aggregates are
// never blocked. Operators see open gaps with Gaps and resolve one with
// SkipTo, which gives up on the missing sequence numbers and lets the parked
// records drain.
//
// # First sight of an aggregate
//
// An aggregate with no position whose first record has s > 1 is a gap from
// 0 by default (FirstSeenStrict): the record is parked until 1..s-1 have
// been applied, and the gap shows in Gaps. The alternative,
// FirstSeenBaseline, applies it and takes s as the starting point; but then
// an earlier record that arrives later (a second relay, a retried publish,
// a producer without ordered delivery) is below the position and skipped as
// a duplicate: it is lost without a trace. Strict never loses a record; its
// cost is visible, not silent: a consumer that starts reading a topic after
// the first events of some aggregates are gone (topic retention, a start at
// the latest offset) parks those aggregates until an operator resolves
// their gaps. Such consumers should choose FirstSeenBaseline.
//
// Records without a sequence bypass this package altogether.
//
// # A building block
//
// consumer.Processor runs this package together with the claim of each
// record's key and the dead-lettering of records that fail, and that
// combination is what the guarantees rest on: parking a record whose key
// was not claimed, or draining outside the transaction that moved the
// position, can apply an event twice or out of order. Use the Tracker on
// its own only to build a processor of your own; operate a running consumer
// through the Processor's Gaps, Position, ResolveGap and DrainReady.
package ordering
