package ordering

import "fmt"

// GapError is returned under GapFail for a record that arrived ahead of a
// gap. It is retryable: the record applies once its predecessors have.
type GapError struct {
	Aggregate Aggregate
	// Want is the sequence the aggregate waits for; Got is the record's.
	Want, Got int64
}

func (e *GapError) Error() string {
	return fmt.Sprintf("ordering: gap in %s: want seq %d, got %d", e.Aggregate, e.Want, e.Got)
}
