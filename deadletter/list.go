package deadletter

import (
	"fmt"
	"time"
)

// ListOpts filters the dead letters consumer.Inspector reads (Letters,
// MatchLetters, PreviewLetters) and the operator's bulk requests, and
// producer.Inspector.DeadEvents (which takes only Status, AggregateType,
// AggregateID, AfterID, Brief and Limit, and refuses the others). Zero
// fields do not filter. A Status or Reason that is not one of the
// package's constants is refused rather than matching nothing.
type ListOpts struct {
	Consumer      string
	Topic         string
	Status        Status
	AggregateType string
	AggregateID   string
	Reason        Reason
	Failure       string
	// IdempotencyKey finds the letters of one key (with Consumer, along
	// an index).
	IdempotencyKey string
	// FailedAfter and FailedBefore bound when a letter first failed: at or
	// after FailedAfter, before FailedBefore.
	FailedAfter, FailedBefore time.Time
	// AfterID pages a listing: only letters with a larger id.
	AfterID int64
	// Brief makes a listing read only the first 256 bytes of each record's key
	// and value ([Letter.ValueSize] keeps the value's whole size) and of its
	// error, and no headers and no stack: a listing's memory is then
	// bounded whatever the records hold. A letter read by its id is whole.
	Brief bool
	// Limit bounds the result. Default 100 for a listing, 1,000,000 for
	// a match or a preview.
	Limit int
}

// Check returns an error when o's Status or Reason is not one of the
// package's constants: such a filter would match nothing.
func (o *ListOpts) Check() error {
	switch o.Status {
	case "", StatusDead, StatusReplayed, StatusDiscarded:
	default:
		return fmt.Errorf("deadletter: unknown status %q; want dead, replayed or discarded", o.Status)
	}
	if o.Reason != "" && !o.Reason.Valid() {
		return fmt.Errorf("deadletter: unknown reason %q; want one of %s", o.Reason, reasonList())
	}
	return nil
}

// Ref names a letter and its place in its aggregate
// (consumer.Inspector.MatchLetters).
type Ref struct {
	ID                         int64
	AggregateType, AggregateID string
	// Seq is 0 for an unsequenced letter.
	Seq int64
}

// Preview is what acting on the letters a filter matches would touch
// (consumer.Inspector.PreviewLetters).
type Preview struct {
	// Letters counts the letters, at most the filter's Limit.
	Letters int64
	// Aggregates counts their distinct aggregates, Parked the records
	// parked behind those aggregates: the successors a replay or discard
	// of the letters would release.
	Aggregates, Parked int64
}

// Failure is a group of a consumer's open letters that failed the same
// way (consumer.Inspector.Failures).
type Failure struct {
	Failure string
	Reason  Reason
	Count   int64
	// Oldest is when the group's first letter first failed, Newest when
	// its last one last failed.
	Oldest, Newest time.Time
	// SampleID is the group's lowest letter id, one to look at.
	SampleID int64
}

// FailureScan is how many of a consumer's open letters, the newest,
// consumer.Inspector.Failures groups: what an operator needs to see which
// faults are new and large, at a cost that does not grow with a backlog of
// old letters.
const FailureScan = 10_000
