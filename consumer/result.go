package consumer

import "fmt"

// Outcome is what processing did with a record.
type Outcome int

const (
	// Applied means the handler ran and its transaction committed (with any
	// parked successors it released).
	Applied Outcome = iota + 1
	// Duplicate means the key was claimed before, or the sequence applied
	// before; the handler did not run.
	Duplicate
	// Parked means the record waits behind a gap in its aggregate's sequence or
	// behind a dead letter of its aggregate.
	Parked
	// DeadLettered means the record is in the dead-letter table.
	DeadLettered
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Parked:
		return "parked"
	case DeadLettered:
		return "dead_lettered"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is the outcome of processing one record.
type Result struct {
	Outcome Outcome
	// Drained counts parked successors applied in the same transaction.
	Drained int
	// Attempts counts the handler runs.
	Attempts int
	// DeadLetterID is set for DeadLettered; Err is why.
	DeadLetterID int64
	Err          error
}
