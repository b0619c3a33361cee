// Package deadletter is the vocabulary of the records a consumer gave up
// on: a Letter holds the record whole (topic, partition, offset, key,
// value, headers with binary values intact), with the error, the stack of
// a panic, how often it was tried, when it first and last failed, its
// Reason and what became of it (Status: dead, replayed or discarded).
// ListOpts filters them, Ref, Preview and Failure are what bulk reads
// return. The same Status and ListOpts serve the producer's dead events.
//
// consumer.Processor writes a letter in its own transaction after the
// record's own transaction rolled back, so the failed effect is gone and
// the letter stays; the table has one row per consumer and record: a
// record that fails again after a redelivery updates its row instead of
// adding one. consumer.Inspector reads the letters; consumer.Processor's
// Replay and Discard resolve one under its row lock, so two operators
// cannot replay one letter twice.
package deadletter
