package producer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
)

// DeadEvent is an event the relay gave up on.
type DeadEvent struct {
	ID             int64
	EventID        string
	IdempotencyKey string
	AggregateType  string
	AggregateID    string
	Seq            int64
	EventType      string
	Topic          *string
	ContentType    *string
	Payload        []byte
	Headers        map[string]string
	CreatedAt      time.Time
	// Attempts counts every failed publish.
	Attempts int
	// LastError is the broker's last answer.
	LastError string
	// Hold reports whether the aggregate's later events wait for this one.
	Hold bool
	// Status is "dead", "replayed" or "discarded".
	Status     string
	DiedAt     time.Time
	ResolvedAt *time.Time
}

// ErrNotDead is returned by Replay and Discard when the id names no event
// in status dead (unknown, or already replayed or discarded).
var ErrNotDead = errors.New("producer: no dead event with that id")

// DeadEvents lists and resolves the dead events of one schema.
type DeadEvents struct {
	db     DB
	schema string
}

// NewDeadEvents returns the dead events of schema ("" means
// outbox.DefaultSchema) in db.
func NewDeadEvents(db DB, schema string) *DeadEvents {
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	return &DeadEvents{db: db, schema: schema}
}

// ListOpts filters List. Zero fields do not filter.
type ListOpts struct {
	// Status is "dead", "replayed" or "discarded".
	Status        string
	AggregateType string
	AggregateID   string
	// Limit caps the result. Default 100.
	Limit int
}

// List returns dead events in id order.
func (d *DeadEvents) List(ctx context.Context, opts *ListOpts) ([]DeadEvent, error) {
	o := ListOpts{}
	if opts != nil {
		o = *opts
	}
	setDefault(&o.Limit, 100)
	rows, err := d.db.Query(ctx, qualify(`
SELECT id, event_id::text, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type,
       topic, content_type, payload, headers, created_at, attempts, last_error, hold, status,
       died_at, resolved_at
FROM {schema}.dead_events
WHERE ($1 = '' OR status = $1) AND ($2 = '' OR aggregate_type = $2) AND ($3 = '' OR aggregate_id = $3)
ORDER BY id
LIMIT $4`, d.schema), o.Status, o.AggregateType, o.AggregateID, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("producer: list dead events: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[DeadEvent])
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
func (d *DeadEvents) Replay(ctx context.Context, id int64) error {
	tag, err := d.db.Exec(ctx, qualify(`
WITH revived AS (
    UPDATE {schema}.dead_events SET status = 'replayed', resolved_at = now()
    WHERE id = $1 AND status = 'dead'
    RETURNING *
)
INSERT INTO {schema}.events (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
                             event_type, topic, content_type, payload, headers, created_at)
OVERRIDING SYSTEM VALUE
SELECT id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
       event_type, topic, content_type, payload, headers, created_at
FROM revived`, d.schema), id)
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
func (d *DeadEvents) Discard(ctx context.Context, id int64) error {
	tag, err := d.db.Exec(ctx, qualify(`
UPDATE {schema}.dead_events SET status = 'discarded', resolved_at = now()
WHERE id = $1 AND status = 'dead'`, d.schema), id)
	if err != nil {
		return fmt.Errorf("producer: discard dead event %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("producer: discard dead event %d: %w", id, ErrNotDead)
	}
	return nil
}
