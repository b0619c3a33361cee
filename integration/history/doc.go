// Package history records what an integration scenario did at both ends of
// the pipeline and checks the outcome against the SDK's guarantees.
//
// Writers record every write attempt (Recorder.Write), whether its
// transaction committed or rolled back; consumers record every handler call
// (Recorder.Handle), whether the effect was applied or skipped as a
// duplicate. Check then counts:
//
//   - lost: committed, never applied;
//   - phantom: applied, never committed;
//   - duplicate effects: applications of an event beyond its first;
//   - reorders: per aggregate, an effect applied out of dense sequence
//     order (lower than, equal to, or more than one above the last applied);
//   - redeliveries: handler calls for an event already seen, applied or
//     skipped. These are expected under at-least-once delivery and are
//     reported, not failed.
//
// The first four must be zero in every scenario (Report.OK).
//
// The package knows nothing of the producer or consumer packages: scenarios
// translate what they see into Write and Handle values.
package history
