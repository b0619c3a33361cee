// Package operator lets an operator replay, discard and resolve a
// consumer's dead letters and gaps from outside the consuming process.
//
// Replaying a letter runs the consumer's handler, which lives in the
// consuming service; a tool outside it (the outbox command, the dashboard,
// a script) cannot call consumer.Processor.Replay itself. It submits a
// Request instead: a row in the operator_requests table naming the
// consumer, the action and the letters (one id, or a filter over the open
// letters), or the aggregate of a gap. The running consumer.Consumer picks
// requests up (it polls, and listens on the schema's channel when its pool
// allows), carries them out through the same code as Processor.Replay,
// Discard and ResolveGap, and writes the outcome back: counts of records
// applied, duplicates, discarded, failed, skipped and drained, and the
// first error. Wait follows a request to its end.
//
// A bulk request keeps order: an aggregate's letters are taken in sequence
// order, each releasing the records parked up to the next, and a letter
// that fails again stops its aggregate (its later letters are skipped, not
// reordered) while the other aggregates go on. Its Rate bounds it in
// letters per second. Before submitting one, consumer.Inspector.PreviewLetters
// counts what it would touch.
//
// Every action leaves a row in operator_audit: who asked (WithActor), what,
// for which letter or aggregate, and what came of it, whether carried out
// for a request or called directly on a Processor.
package operator
