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
// An aggregate with no position whose first record has s > 1 is taken as
// the baseline by default (FirstSeenBaseline): the producer's relay puts an
// aggregate's events on the wire in sequence order on one partition, so a
// first sighting above 1 almost always means the consumer started after the
// earlier events were gone (topic retention, a start at the latest offset),
// and waiting for them would park the aggregate forever. FirstSeenStrict
// treats it as a gap from 0 instead; choose it when producers can put an
// aggregate's events on the wire out of order and the topic is read from its
// start.
//
// Records without a sequence bypass this package altogether.
package ordering
