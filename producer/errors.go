package producer

import (
	"errors"
	"fmt"
)

// ValidationError says which field of which event was refused and why:
// an empty required field, text that is not UTF-8, a record over
// [WriterConfig.MaxRecordBytes], a field over its outbox.Max*Bytes limit, a
// reserved or malformed header. Nothing is written when Write returns one;
// the error is permanent (the same event is refused again).
type ValidationError struct {
	// Index is the event's position in the Write call.
	Index int
	// Field names the offending field of Event, such as "AggregateID".
	Field string
	// Reason says what is wrong.
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("producer: event %d: %s %s", e.Index, e.Field, e.Reason)
}

// ErrNoTx is returned by Write when it is given a nil transaction.
var ErrNoTx = errors.New("producer: write needs the caller's transaction; got nil")

// ErrSequenceExhausted is returned, wrapped, by Write when an aggregate's
// sequence stands at the largest bigint (9223372036854775807, math.MaxInt64)
// and so has no number for the aggregate's next event. The statement failed
// and aborted the transaction: roll it back. No further event can be
// written for that aggregate.
var ErrSequenceExhausted = errors.New("producer: aggregate sequence exhausted")
