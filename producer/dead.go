package producer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
)

// Status is what became of a dead event.
type Status string

const (
	// StatusDead is an event waiting for an operator. When its Hold is set,
	// its aggregate's later events wait behind it.
	StatusDead Status = "dead"
	// StatusReplayed is an event put back into the outbox by Replay.
	StatusReplayed Status = "replayed"
	// StatusDiscarded is an event given up on by Discard.
	StatusDiscarded Status = "discarded"
)

// DeadEvent is an event the relay gave up on. Its JSON names are the
// table's columns (snake_case), as the CLI's -o json prints them.
type DeadEvent struct {
	ID             int64             `db:"id" json:"id"`
	EventID        string            `db:"event_id" json:"event_id"`
	IdempotencyKey string            `db:"idempotency_key" json:"idempotency_key"`
	AggregateType  string            `db:"aggregate_type" json:"aggregate_type"`
	AggregateID    string            `db:"aggregate_id" json:"aggregate_id"`
	Seq            int64             `db:"aggregate_seq" json:"aggregate_seq"`
	EventType      string            `db:"event_type" json:"event_type"`
	Topic          *string           `db:"topic" json:"topic,omitempty"`
	ContentType    *string           `db:"content_type" json:"content_type,omitempty"`
	Payload        []byte            `db:"payload" json:"payload"`
	Headers        map[string]string `db:"headers" json:"headers"`
	CreatedAt      time.Time         `db:"created_at" json:"created_at"`
	// Attempts counts every failed publish.
	Attempts int `db:"attempts" json:"attempts"`
	// LastError is the broker's last answer.
	LastError string `db:"last_error" json:"last_error"`
	// Hold reports whether the aggregate's later events wait for this one.
	Hold       bool       `db:"hold" json:"hold"`
	Status     Status     `db:"status" json:"status"`
	DiedAt     time.Time  `db:"died_at" json:"died_at"`
	ResolvedAt *time.Time `db:"resolved_at" json:"resolved_at,omitempty"`
	// PayloadSize is the payload's size as stored; a Brief listing reads
	// only a prefix of it into Payload.
	PayloadSize int `db:"payload_size" json:"payload_size"`
}

// DeadEventsConfig tunes DeadEvents. The zero value is valid.
type DeadEventsConfig struct {
	// Schema holds the outbox tables. Default outbox.DefaultSchema.
	Schema string
}

// DeadEvents lists and resolves the dead events of one schema, in the
// database handle each call is given, as deadletter.Store does for the
// consumer's dead letters.
type DeadEvents struct {
	sql tables.DeadEvents
}

// NewDeadEvents returns the dead events of cfg's schema (nil means the
// defaults).
func NewDeadEvents(cfg *DeadEventsConfig) *DeadEvents {
	schema := outbox.DefaultSchema
	if cfg != nil && cfg.Schema != "" {
		schema = cfg.Schema
	}
	return &DeadEvents{sql: tables.ProducerFor(schema).DeadEvents}
}

// ListOpts filters List. Zero fields do not filter.
type ListOpts struct {
	Status        Status
	AggregateType string
	AggregateID   string
	// AfterID pages: only events with a larger id.
	AfterID int64
	// Brief makes List read only the first 256 bytes of each payload
	// (DeadEvent.PayloadSize keeps its whole size) and of its last error,
	// and no headers: a listing's memory is then bounded whatever the
	// events hold.
	Brief bool
	// Limit caps the result. Default 100.
	Limit int
}

// List returns dead events in id order.
func (d *DeadEvents) List(ctx context.Context, db outbox.DB, opts *ListOpts) ([]DeadEvent, error) {
	o := ListOpts{}
	if opts != nil {
		o = *opts
	}
	setDefault(&o.Limit, 100)
	sql := d.sql.List
	if o.Brief {
		sql = d.sql.ListBrief
	}
	rows, err := db.Query(ctx, sql, tables.Filter(string(o.Status)), tables.Filter(o.AggregateType), tables.Filter(o.AggregateID), o.AfterID, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("producer: list dead events: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[DeadEvent])
	if err != nil {
		return nil, fmt.Errorf("producer: list dead events: %w", err)
	}
	return list, nil
}

// Replay puts a dead event back into the outbox under its original id, with
// its attempts reset, so the relay publishes it next and then the events of
// its aggregate that waited behind it, in order. Fix the cause first (grow
// max.message.bytes, create the topic, grant the ACL); an event that fails
// again goes back to the dead events.
//
// The event keeps its original creation time, so until it is delivered
// Health.OldestUndelivered reports its age. Under SkipDead its successors
// went out long ago, so it reaches consumers after them.
func (d *DeadEvents) Replay(ctx context.Context, db outbox.DB, id int64) error {
	tag, err := db.Exec(ctx, d.sql.Replay, id)
	if err != nil {
		return fmt.Errorf("producer: replay dead event %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("producer: replay dead event %d: %w", id, ErrNotDead)
	}
	return nil
}

// Discard gives a dead event up for good and releases the events of its
// aggregate that waited behind it. Consumers that check sequences will see
// a gap where it was; resolve it there too.
func (d *DeadEvents) Discard(ctx context.Context, db outbox.DB, id int64) error {
	tag, err := db.Exec(ctx, d.sql.Discard, id)
	if err != nil {
		return fmt.Errorf("producer: discard dead event %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("producer: discard dead event %d: %w", id, ErrNotDead)
	}
	return nil
}
