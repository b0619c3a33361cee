// Package deadletter keeps the records a consumer gave up on, whole (topic,
// partition, offset, key, value, headers with binary values intact), with
// the error, the stack of a panic, how often it was tried, when it first
// and last failed, and what became of it: dead, replayed or discarded.
//
// A dead letter is written in its own transaction after the record's own
// transaction rolled back, so the failed effect is gone and the letter
// stays. The table has one row per consumer and record: a record that fails
// again after a redelivery updates its row instead of adding one.
//
// Replay and Discard take the letter's row lock for the length of their
// transaction, so two operators cannot replay one letter twice; the work
// that re-applies the record (dedupe, ordering, the handler, draining the
// successors parked behind it) is passed in by the consumer package, which
// exposes it as consumer.Processor's Replay and Discard.
//
// This package is a building block of consumer.Processor: a letter put
// without holding its aggregate lets the aggregate's next record overtake
// it. List and Get are safe for anyone; operate a running consumer's
// letters through the Processor's DeadLetters, DeadLetter, Replay and
// Discard.
package deadletter
