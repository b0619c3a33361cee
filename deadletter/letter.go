package deadletter

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Status is what became of a dead letter, or of a dead event of package
// producer (producer.DeadEvent.Status).
type Status string

const (
	// StatusDead is a letter waiting for an operator. Its aggregate's
	// later records are parked behind it (for a dead event: its
	// aggregate's later events wait when its Hold is set).
	StatusDead Status = "dead"
	// StatusReplayed is a letter applied by consumer.Processor.Replay (a
	// dead event put back into the outbox by producer.DeadEvents.Replay).
	StatusReplayed Status = "replayed"
	// StatusDiscarded is a letter given up on by consumer.Processor.Discard;
	// its successors were released.
	StatusDiscarded Status = "discarded"
)

// Letter is one dead record.
type Letter struct {
	ID       int64
	Consumer string
	// Record is the record as it arrived.
	Record *kgo.Record
	// IdempotencyKey is the key the record was to be claimed under; empty
	// when it had none (which may be why it is here).
	IdempotencyKey string
	// AggregateType, AggregateID and Seq are the record's ordering fields;
	// Seq is 0 when the record had no sequence.
	AggregateType, AggregateID string
	Seq                        int64
	// Error is why the record failed; Stack is the handler's stack when it
	// panicked.
	Error, Stack string
	// Reason is the class of the failure, one of Reasons.
	Reason Reason
	// Failure is the failure's fingerprint: letters that fail the same way
	// (the same reason, error type and handler frame, or the same error
	// wording up to its numbers) share it. Failures groups them by it.
	Failure string
	// History is each delivery of the record that failed, oldest first,
	// the newest 20 kept; a Brief listing reads none.
	History []Delivery
	// ValueSize is the size of the record's value as stored; a Brief
	// listing reads only a prefix of it into Record.Value.
	ValueSize int
	// Attempts counts the tries, over all deliveries.
	Attempts      int
	FirstFailedAt time.Time
	LastFailedAt  time.Time
	Status        Status
	// ResolvedAt is when it was replayed or discarded.
	ResolvedAt *time.Time
}

// Delivery is one delivery of a record that failed: when its last try
// failed, how many tries it had, and the first 1,024 characters of the
// error.
type Delivery struct {
	At       time.Time `json:"at"`
	Attempts int       `json:"attempts"`
	Error    string    `json:"error"`
}
