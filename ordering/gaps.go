package ordering

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// OpenGap is an aggregate with records parked behind missing sequences.
type OpenGap struct {
	Aggregate Aggregate
	// Last is the last sequence applied; Expected = Last+1 is missing.
	Last, Expected int64
	// FirstParked is the lowest parked sequence; the gap is
	// Expected..FirstParked-1. It is 0, as Parked is, for an aggregate
	// with nothing parked whose dead letter lies beyond Expected: the gap
	// is then Expected..DeadLetterSeq-1.
	FirstParked int64
	// Parked is how many records wait.
	Parked int
	// Since is when the oldest of them was parked, or when the letter
	// first failed.
	Since time.Time
	// DeadLetterID is the lowest open dead letter inside the gap, at
	// DeadLetterSeq (Expected when the gap is that record alone); 0 when
	// the gap holds only missing records.
	DeadLetterID, DeadLetterSeq int64
}

// GapOpts filters and pages a consumer's gaps (consumer.Inspector.Gaps).
// Consumer is required; the other zero fields do not filter.
type GapOpts struct {
	// Consumer names the consumer whose gaps are read.
	Consumer string
	// AggregateType and AggregateID keep the gaps of one aggregate type,
	// or of one aggregate.
	AggregateType, AggregateID string
	// ParkedBefore keeps the gaps whose lowest parked record was parked
	// before it: the ones at least that old.
	ParkedBefore time.Time
	// After pages: the page starts after this aggregate, in (type, id)
	// order; give [GapPage.Next] of the page before.
	After *Aggregate
	// Limit bounds how many aggregates a page walks. Default 100.
	Limit int
}

// GapPage is a page of a consumer's gaps.
type GapPage struct {
	// Gaps are the open gaps of the page's aggregates, in aggregate order.
	Gaps []OpenGap
	// Next is where the next page starts; nil after the last page. With
	// ParkedBefore set, a page may hold fewer gaps than Limit (even none)
	// and still have a Next.
	Next *Aggregate
}

// Parked is a record waiting in the parked table for an earlier sequence
// of its aggregate.
type Parked struct {
	Aggregate Aggregate
	Seq       int64
	// Record is the record as it arrived: topic, partition, offset, key,
	// value, headers and timestamp (a listing reads a prefix of the key
	// and value and no headers).
	Record *kgo.Record
	// IdempotencyKey is the key the record was claimed under, if any.
	IdempotencyKey string
	ParkedAt       time.Time
}
