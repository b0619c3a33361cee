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
// [Inspector.DeadEvents] and [Inspector.DeadEvent] read them. Its JSON names are its fields' in snake_case, as the CLI's -o json
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

// DeadEvents holds the operator's verbs on the dead events of one schema:
// Replay and Discard. Reading them is Inspector's (DeadEvents, DeadEvent).
// Each verb takes its database handle, so that it can commit in the
// caller's transaction together with what records it (an audit row of
// package operator, as the dashboard writes one).
type DeadEvents struct {
	sql tables.DeadEvents
}

// NewDeadEvents returns the verbs on the dead events of cfg's schema (nil
// means the defaults). It refuses a schema name longer than PostgreSQL
// keeps.
func NewDeadEvents(cfg *DeadEventsConfig) (*DeadEvents, error) {
	schema := outbox.DefaultSchema
	if cfg != nil && cfg.Schema != "" {
		schema = cfg.Schema
	}
	if err := tables.CheckSchema(schema); err != nil {
		return nil, fmt.Errorf("producer: NewDeadEvents: %w", err)
	}
	return &DeadEvents{sql: tables.ProducerFor(schema).DeadEvents}, nil
}

// listDead reads the dead events that opts (nil: all) matches with sql;
// [Inspector.DeadEvents] says which filters it takes.
func listDead(ctx context.Context, db outbox.DB, sql tables.DeadEvents, opts *deadletter.ListOpts) ([]DeadEvent, error) {
	o := deadletter.ListOpts{}
	if opts != nil {
		o = *opts
	}
	if err := checkDeadFilter(&o); err != nil {
		return nil, err
	}
	setDefault(&o.Limit, 100)
	stmt := sql.List
	if o.Brief {
		stmt = sql.ListBrief
	}
	rows, err := db.Query(ctx, stmt, tables.Filter(string(o.Status)), tables.Filter(o.AggregateType), tables.Filter(o.AggregateID), o.AfterID, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("producer: list dead events: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[DeadEvent])
	if err != nil {
		return nil, fmt.Errorf("producer: list dead events: %w", err)
	}
	return list, nil
}

// checkDeadFilter refuses a filter that listDead cannot apply to dead
// events: a consumer's fields, or a Status that is none of deadletter's.
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

// findDead reads dead event id with sql, as a Brief listing does when
// brief is set, or returns an error wrapping outbox.ErrNotFound.
func findDead(ctx context.Context, db outbox.DB, sql tables.DeadEvents, id int64, brief bool) (*DeadEvent, error) {
	list, err := listDead(ctx, db, sql, &deadletter.ListOpts{AfterID: id - 1, Limit: 1, Brief: brief})
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
// [Health.OldestUndelivered] reports its age. Under SkipDead its successors
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
	e, err := findDead(ctx, db, d.sql, id, true)
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		return fmt.Errorf("producer: %s dead event %d: %w", verb, id, outbox.ErrNotFound)
	case err != nil:
		return fmt.Errorf("producer: %s dead event %d: %w", verb, id, err)
	}
	return fmt.Errorf("producer: %s dead event %d: it is %s: %w", verb, id, e.Status, deadletter.ErrResolved)
}
