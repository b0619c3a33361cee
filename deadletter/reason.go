package deadletter

import (
	"fmt"
	"strings"
)

// Reason is the class of a letter's failure: why the consumer gave the
// record up. It is stored in the letter ([Letter.Reason]), filters listings
// ([ListOpts.Reason]) and labels the consumer's health (consumer.LetterCount).
// The consumer writes only the values below; Reasons lists them.
type Reason string

const (
	// ReasonHandler is a record whose handler returned an error on every
	// try (once, when the error was consumer.Permanent). Read [Letter.Error],
	// fix the handler or the data it needs, then replay.
	ReasonHandler Reason = "handler"
	// ReasonPanic is a record whose handler panicked on every try;
	// [Letter.Stack] holds the stack of the last panic. Fix the bug the
	// stack points at, deploy, then replay.
	ReasonPanic Reason = "panic"
	// ReasonTimeout is a record whose handler did not finish within the
	// consumer's HandlerTimeout on every try. Find what it waited on (a
	// lock, a slow call); raise HandlerTimeout only if the work is
	// legitimately that long; then replay.
	ReasonTimeout Reason = "timeout"
	// ReasonSequence is a record whose idempotency key is new but whose
	// aggregate sequence was passed or is taken by another record
	// (consumer.SequenceReusedError): a producer reused the sequence, or
	// the record's key was pruned before it came back. It holds nothing
	// back. Fix the producer, then discard the letter; replaying it
	// fails again.
	ReasonSequence Reason = "sequence"
	// ReasonInput is a record that broke the wire contract (a malformed or
	// missing header, no key, a value over the consumer's MaxValueBytes)
	// or that the database refused to store, and so never reached the
	// handler. Fix the producer, then discard the letter; replay it only
	// after changing the consumer's configuration (a KeyFunc, a larger
	// MaxValueBytes) so that it accepts the record.
	ReasonInput Reason = "input"
	// ReasonDeliveryLimit is a record that a share group delivered for the
	// last time before the consumer finished it (consumer.ErrDeliveryLimit):
	// the broker would not deliver it again, so the letter keeps it.
	// [Letter.History] says why its deliveries failed; fix that (often a
	// consumer that crashed or was stopped mid-record), then replay.
	ReasonDeliveryLimit Reason = "delivery_limit"
	// ReasonConflict is a conflicting duplicate: a record whose idempotency
	// key was claimed before by a record of another identity (aggregate,
	// sequence or payload). Its error shows the stored identity and the
	// record's; the record itself is the letter. Discard it once the
	// producer is fixed; a replay conflicts again.
	ReasonConflict Reason = "conflict"
)

// reasons are the Reason values, in the order Reasons returns them.
var reasons = []Reason{ReasonHandler, ReasonPanic, ReasonTimeout, ReasonSequence, ReasonInput, ReasonDeliveryLimit, ReasonConflict}

// Reasons returns every Reason the consumer writes, in a fixed order: the
// list a filter offers. The slice is the caller's.
func Reasons() []Reason {
	return append([]Reason(nil), reasons...)
}

// Valid reports whether r is one of Reasons.
func (r Reason) Valid() bool {
	for _, v := range reasons {
		if r == v {
			return true
		}
	}
	return false
}

// ParseReason returns s as a Reason, or an error that lists the valid
// ones when s is not one of Reasons. The empty string is the empty Reason
// (no filter).
func ParseReason(s string) (Reason, error) {
	r := Reason(s)
	if s == "" || r.Valid() {
		return r, nil
	}
	return "", fmt.Errorf("deadletter: unknown reason %q; want one of %s", s, reasonList())
}

// reasonList is the valid reasons separated by commas.
func reasonList() string {
	names := make([]string, len(reasons))
	for i, r := range reasons {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}
