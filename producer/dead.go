package producer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/tables"
)

// DeadEvent is an event the relay gave up on: the producer's side of what
// deadletter.Letter is for a consumer, with the same names where they mean
// the same (Seq, Error, Attempts, LastFailedAt, Status, ResolvedAt).
// Its JSON names are its fields' in snake_case, as the CLI's -o json
// prints them and as it prints a letter's.
type DeadEvent struct {
	ID             int64             `db:"id" json:"id"`
	EventID        string            `db:"event_id" json:"event_id"`
	IdempotencyKey string            `db:"idempotency_key" json:"idempotency_key"`
	AggregateType  string            `db:"aggregate_type" json:"aggregate_type"`
	AggregateID    string            `db:"aggregate_id" json:"aggregate_id"`
	Seq            int64             `db:"aggregate_seq" json:"seq"`
	EventType      string            `db:"event_type" json:"event_type"`
	Topic          *string           `db:"topic" json:"topic,omitempty"`
	ContentType    *string           `db:"content_type" json:"content_type,omitempty"`
	Payload        []byte            `db:"payload" json:"payload"`
	Headers        map[string]string `db:"headers" json:"headers"`
	CreatedAt      time.Time         `db:"created_at" json:"created_at"`
	// Attempts counts every failed publish.
	Attempts int `db:"attempts" json:"attempts"`
	// Error is the broker's last answer: why the event died.
	Error string `db:"last_error" json:"error"`
	// Hold reports whether the aggregate's later events wait for this one.
	Hold   bool              `db:"hold" json:"hold"`
	Status deadletter.Status `db:"status" json:"status"`
	// LastFailedAt is when its last publish failed and the relay gave it
	// up.
	LastFailedAt time.Time `db:"died_at" json:"last_failed_at"`
	// ResolvedAt is when it was replayed or discarded.
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

// List returns the dead events that opts (nil: all) matches, in id order.
// It takes the consumer's filter, deadletter.ListOpts, and of it only
// Status, AggregateType, AggregateID, AfterID (only events with a larger
// id), Brief and Limit (default 100); a filter on another field is refused
// with an error, not ignored. Brief reads only the first 256 bytes of each
// payload (DeadEvent.PayloadSize keeps its whole size) and of its error,
// and no headers: a listing's memory is then bounded whatever the events
// hold.
func (d *DeadEvents) List(ctx context.Context, db outbox.DB, opts *deadletter.ListOpts) ([]DeadEvent, error) {
	o := deadletter.ListOpts{}
	if opts != nil {
		o = *opts
	}
	if err := checkDeadFilter(&o); err != nil {
		return nil, err
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

// checkDeadFilter refuses a filter that List cannot apply to dead events:
// a consumer's fields, or a Status that is none of deadletter's.
func checkDeadFilter(o *deadletter.ListOpts) error {
	if err := o.Check(); err != nil {
		return fmt.Errorf("producer: list dead events: %w", err)
	}
	var set []string
	for _, f := range []struct {
		name string
		set  bool
	}{{"Consumer", o.Consumer != ""}, {"Topic", o.Topic != ""}, {"Reason", o.Reason != ""}, {"Failure", o.Failure != ""},
		{"IdempotencyKey", o.IdempotencyKey != ""}, {"FailedAfter", !o.FailedAfter.IsZero()}, {"FailedBefore", !o.FailedBefore.IsZero()}} {
		if f.set {
			set = append(set, f.name)
		}
	}
	if len(set) > 0 {
		return fmt.Errorf("producer: list dead events: ListOpts.%s filters only a consumer's dead letters; "+
			"filter dead events by Status, AggregateType and AggregateID", strings.Join(set, ", ListOpts."))
	}
	return nil
}

// Get returns dead event id whole, or an error wrapping outbox.ErrNotFound.
func (d *DeadEvents) Get(ctx context.Context, db outbox.DB, id int64) (*DeadEvent, error) {
	return d.find(ctx, db, id, false)
}

// find reads dead event id, as a Brief listing does when brief is set.
func (d *DeadEvents) find(ctx context.Context, db outbox.DB, id int64, brief bool) (*DeadEvent, error) {
	list, err := d.List(ctx, db, &deadletter.ListOpts{AfterID: id - 1, Limit: 1, Brief: brief})
	if err != nil {
		return nil, err
	}
	if len(list) == 0 || list[0].ID != id {
		return nil, fmt.Errorf("producer: dead event %d: %w", id, outbox.ErrNotFound)
	}
	return &list[0], nil
}

// Replay puts a dead event back into the outbox under its original id, with
// its attempts reset, so the relay publishes it next and then the events of
// its aggregate that waited behind it, in order. Fix the cause first (grow
// max.message.bytes, create the topic, grant the ACL); an event that fails
// again goes back to the dead events. An unknown id gives an error wrapping
// outbox.ErrNotFound, an event replayed or discarded already one wrapping
// deadletter.ErrResolved.
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
		return d.notDead(ctx, db, "replay", id)
	}
	return nil
}

// Discard gives a dead event up for good and releases the events of its
// aggregate that waited behind it. Consumers that check sequences will see
// a gap where it was; resolve it there too. Its errors are Replay's.
func (d *DeadEvents) Discard(ctx context.Context, db outbox.DB, id int64) error {
	tag, err := db.Exec(ctx, d.sql.Discard, id)
	if err != nil {
		return fmt.Errorf("producer: discard dead event %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return d.notDead(ctx, db, "discard", id)
	}
	return nil
}

// notDead is the error of a replay or discard of id that found no dead
// event in status dead: outbox.ErrNotFound when there is none,
// deadletter.ErrResolved when it was resolved already.
func (d *DeadEvents) notDead(ctx context.Context, db outbox.DB, verb string, id int64) error {
	e, err := d.find(ctx, db, id, true)
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		return fmt.Errorf("producer: %s dead event %d: %w", verb, id, outbox.ErrNotFound)
	case err != nil:
		return fmt.Errorf("producer: %s dead event %d: %w", verb, id, err)
	}
	return fmt.Errorf("producer: %s dead event %d: it is %s: %w", verb, id, e.Status, deadletter.ErrResolved)
}
