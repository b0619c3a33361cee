package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
)

// ErrAggregateMoved is wrapped by the *MovedError that Write returns for
// an aggregate moved to another shard (package move): its events are
// written there now.
var ErrAggregateMoved = errors.New("producer: aggregate moved to another shard")

// MovedError is Write's error for an aggregate moved to another shard: no
// event of it was written here. Events of the call's other aggregates may
// have been, so roll the transaction back, and write the aggregate's
// events, with the rest of that transaction, on shard To. It wraps
// ErrAggregateMoved.
type MovedError struct {
	// AggregateType and AggregateID name the moved aggregate (the first
	// in sort order when several of the call's aggregates moved).
	AggregateType, AggregateID string
	// To is the name of the shard it moved to.
	To string
	// Arriving says that a move from shard To to this shard has reserved
	// the aggregate here and is closing it on To: for a moment neither
	// shard takes its writes. Retry the transaction here shortly.
	Arriving bool
}

func (e *MovedError) Error() string {
	if e.Arriving {
		return fmt.Sprintf("producer: aggregate %s/%s is being moved here from shard %q and does not take writes until the move opens it here; retry the transaction in a moment",
			e.AggregateType, e.AggregateID, e.To)
	}
	return fmt.Sprintf("producer: aggregate %s/%s moved to shard %q; roll the transaction back and write its events on that shard",
		e.AggregateType, e.AggregateID, e.To)
}

// Unwrap returns ErrAggregateMoved.
func (e *MovedError) Unwrap() error { return ErrAggregateMoved }

// WriterConfig tunes a Writer. The zero value is valid.
type WriterConfig struct {
	// Schema holds the outbox tables. Default outbox.DefaultSchema.
	Schema string
	// MaxRecordBytes refuses, before anything is written, an event whose
	// Kafka record would be larger: its key, payload and headers (the
	// SDK's and the event's own, with the trace context) in a record batch
	// of its own, as the client's kgo.ProducerBatchMaxBytes and the topic's
	// max.message.bytes count it (uncompressed). It is one setting for both
	// ends: give the relay the same value in [RelayConfig.MaxRecordBytes],
	// and NewRelay refuses a client that cannot send such a record, so an
	// event that Write accepts can always be published. Default
	// DefaultMaxRecordBytes (1,000,012 bytes, franz-go's and Kafka's
	// default limit).
	MaxRecordBytes int
	// Propagator, when set, copies the trace context of Write's ctx into
	// each event's headers (a header the event sets itself wins), so that
	// it travels with the event to its consumers. Default nil.
	Propagator Propagator
	// CDC is for a schema dispatched by change data capture (SetDispatch
	// with DispatchCDC, docs/cdc.md). Write then sends no wake-up (no
	// relay waits for one), and writes the topic column for every event:
	// its own Topic, else Topic below, else its aggregate type, as a relay
	// would choose; the connector's router routes by that column and
	// cannot fall back. Default false.
	CDC bool
	// Topic is the topic of events that name none, with CDC set. Ignored
	// without CDC: a relay's [RelayConfig.Topic] chooses then. Default: the
	// event's aggregate type.
	Topic string
}

// Writer inserts events into the outbox inside the caller's transaction.
// It holds no connection and is safe for concurrent use.
type Writer struct {
	maxRecord  int
	schema     string
	propagator Propagator
	// cdc and topic are [WriterConfig.CDC] and [WriterConfig.Topic].
	cdc   bool
	topic string
	// bad is why cfg cannot work (a schema name PostgreSQL would cut);
	// Write returns it.
	bad error
	// sql are the statements for one event and for several, each without
	// and with the wake-up check (see wakeGate).
	sql tables.Writer
}

// NewWriter returns a Writer for cfg (nil means defaults).
func NewWriter(cfg *WriterConfig) *Writer {
	if cfg == nil {
		cfg = &WriterConfig{}
	}
	schema := cfg.Schema
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	maxRecord := cfg.MaxRecordBytes
	if maxRecord <= 0 {
		maxRecord = DefaultMaxRecordBytes
	}
	var bad error
	if err := tables.CheckSchema(schema); err != nil {
		bad = fmt.Errorf("producer: %w", err)
	}
	return &Writer{
		bad:        bad,
		maxRecord:  maxRecord,
		schema:     schema,
		propagator: cfg.Propagator,
		cdc:        cfg.CDC,
		topic:      cfg.Topic,
		sql:        tables.ProducerFor(schema).Writer,
	}
}

var defaultWriter = NewWriter(nil)

// Write inserts events with the default WriterConfig; see [Writer.Write].
func Write(ctx context.Context, tx pgx.Tx, events ...Event) ([]Written, error) {
	return defaultWriter.Write(ctx, tx, events...)
}

// Write inserts events into the outbox inside tx and returns, in the order
// given, their ids and sequence numbers. The events become visible to the
// relay when tx commits, and vanish if it rolls back: an event exists if and
// only if the caller's transaction commits.
//
// Each aggregate's events get consecutive sequence numbers continuing from
// its last committed one. The sequence row stays locked until tx ends, so a
// concurrent writer of the same aggregate waits; keep such transactions
// short. One call locks its aggregates in a fixed order, but two calls in
// one transaction lock in call order: two transactions that each write
// aggregates A and B in opposite orders can deadlock (PostgreSQL then
// aborts one). Write all of a transaction's events in one call to avoid it.
//
// With [WriterConfig.CDC], Write sends no wake-up and the rest of this
// paragraph does not apply. Otherwise Write also wakes a relay that is
// idle, with a notification that is sent only if tx commits. Whether a
// relay is idle is looked up by Write's statement, with its snapshot (under
// REPEATABLE READ or SERIALIZABLE, the transaction's), not at commit; and
// for a few milliseconds after a write of this process found no relay idle,
// writes to the same database and schema do not ask. A relay that went idle
// meanwhile looks for work once more shortly after. While a relay is idle,
// of the writes that run at once only one per 5 ms notifies; the others
// rely on its commit, and after a rollback on the first notifying write of
// a later slot. So for the lowest latency keep the rest of the transaction
// short after Write. A missed wake-up delays the events by at most the
// relay's PollInterval; it never loses them.
//
// Invalid input (see ValidationError; the aggregate type, aggregate id and
// idempotency key are bounded by outbox.MaxAggregateTypeBytes and the
// others) is refused with a *ValidationError before anything is sent
// to the database. An aggregate moved to another shard (package move) gets
// no event and Write returns a *MovedError, which wraps ErrAggregateMoved
// and names the shard; roll the transaction back. An aggregate still
// arriving from another shard gets its events, held until the move
// releases them. A nil tx returns ErrNoTx; a finished one returns an error
// wrapping pgx.ErrTxClosed.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, events ...Event) ([]Written, error) {
	if tx == nil {
		return nil, ErrNoTx
	}
	if w.bad != nil {
		return nil, w.bad
	}
	if len(events) == 0 {
		return nil, nil
	}
	events = w.withTraceContext(ctx, events)
	for i := range events {
		if err := events[i].validate(i, w.maxRecord); err != nil {
			return nil, err
		}
	}
	var gate *wakeGate
	check := false
	if !w.cdc {
		gate = wakeRegistry.forTx(tx, w.schema)
		check = gate.due()
	}
	var (
		out  []Written
		wake wakeAnswer
		err  error
	)
	sent := time.Now()
	if len(events) == 1 {
		out, wake, err = w.writeOne(ctx, tx, &events[0], check)
	} else {
		out, wake, err = w.writeMany(ctx, tx, events, check)
	}
	if err != nil {
		return nil, err
	}
	if check && wake.did == tables.WakeNoneIdle && wake.fresh {
		gate.quiet(sent)
	}
	return out, nil
}

// withTraceContext returns events with the propagator's headers for ctx
// added to each, under the event's own; events itself when there is no
// propagator or it adds nothing. The caller's events are not modified.
func (w *Writer) withTraceContext(ctx context.Context, events []Event) []Event {
	if w.propagator == nil {
		return events
	}
	trace := map[string]string{}
	w.propagator.Inject(ctx, trace)
	if len(trace) == 0 {
		return events
	}
	out := slices.Clone(events)
	for i := range out {
		h := maps.Clone(trace)
		maps.Copy(h, out[i].Headers)
		out[i].Headers = h
	}
	return out
}

// wakeAnswer is what the wake-up columns said: what the write did about an
// idle relay (tables.WakeNoneIdle, WakeOtherNotifies or WakeNotified), and
// whether its snapshot was the statement's own. Only a fresh WakeNoneIdle
// quiets the gate: after WakeOtherNotifies a relay is idle, and the write
// that notifies it may yet roll back.
type wakeAnswer struct {
	did   int
	fresh bool
}

// stored is what Write stores for an event beyond its fields as given: a
// new event id, the idempotency key (the id unless set), the payload (never
// nil) and the headers as JSON ("" when there are none).
type stored struct {
	id, key, headers string
	payload          []byte
}

func (e *Event) stored(i int) (stored, error) {
	s := stored{id: uuidV7(), key: e.IdempotencyKey, payload: e.Payload}
	if s.key == "" {
		s.key = s.id
	}
	if s.payload == nil {
		s.payload = []byte{}
	}
	if len(e.Headers) > 0 {
		b, err := json.Marshal(e.Headers)
		if err != nil {
			return stored{}, fmt.Errorf("producer: encode headers of event %d: %w", i, err)
		}
		s.headers = string(b)
	}
	return s, nil
}

// topicOf is what Write stores in the topic column for e: its own Topic;
// with CDC, never empty (see [WriterConfig.CDC]).
func (w *Writer) topicOf(e *Event) string {
	if e.Topic != "" || !w.cdc {
		return e.Topic
	}
	if w.topic != "" {
		return w.topic
	}
	return e.AggregateType
}

// orNull is v, or NULL when v is empty.
func orNull(v string) any {
	if v == "" {
		return nil
	}
	return v
}

func (w *Writer) writeOne(ctx context.Context, tx pgx.Tx, e *Event, check bool) ([]Written, wakeAnswer, error) {
	s, err := e.stored(0)
	if err != nil {
		return nil, wakeAnswer{}, err
	}
	args := []any{s.id, s.key, e.AggregateType, e.AggregateID, e.EventType, orNull(w.topicOf(e)), orNull(e.ContentType), s.payload, orNull(s.headers)}
	wr := Written{EventID: s.id}
	var wake wakeAnswer
	if check {
		err = tx.QueryRow(ctx, w.sql.InsertOneWake, args...).Scan(&wr.ID, &wr.Seq, &wake.did, &wake.fresh)
	} else {
		err = tx.QueryRow(ctx, w.sql.InsertOne, args...).Scan(&wr.ID, &wr.Seq)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if err := w.movedErr(ctx, tx, []Event{*e}); !errors.Is(err, errNotMoved) {
			return nil, wakeAnswer{}, err
		}
		return nil, wakeAnswer{}, errors.New("producer: insert events: no row came back")
	}
	if err != nil {
		return nil, wakeAnswer{}, writeErr(err, []Event{*e})
	}
	return []Written{wr}, wake, nil
}

func (w *Writer) writeMany(ctx context.Context, tx pgx.Tx, events []Event, check bool) ([]Written, wakeAnswer, error) {
	n := len(events)
	var (
		eventIDs     = make([]string, n)
		keys         = make([]string, n)
		aggTypes     = make([]string, n)
		aggIDs       = make([]string, n)
		eventTypes   = make([]string, n)
		topics       = make([]string, n)
		contentTypes = make([]string, n)
		payloads     = make([][]byte, n)
		headers      = make([]string, n)
		index        = make(map[string]int, n)
	)
	for i := range events {
		e := &events[i]
		s, err := e.stored(i)
		if err != nil {
			return nil, wakeAnswer{}, err
		}
		eventIDs[i], keys[i], payloads[i], headers[i] = s.id, s.key, s.payload, s.headers
		if headers[i] == "" {
			headers[i] = "{}"
		}
		aggTypes[i], aggIDs[i], eventTypes[i] = e.AggregateType, e.AggregateID, e.EventType
		topics[i], contentTypes[i] = w.topicOf(e), e.ContentType
		index[s.id] = i
	}
	sql := w.sql.InsertMany
	if check {
		sql = w.sql.InsertManyWake
	}
	rows, err := tx.Query(ctx, sql, eventIDs, keys, aggTypes, aggIDs, eventTypes, topics, contentTypes, payloads, headers)
	if err != nil {
		return nil, wakeAnswer{}, writeErr(err, events)
	}
	out := make([]Written, n)
	var (
		got  int
		wake wakeAnswer
		wr   Written
	)
	dest := []any{&wr.ID, &wr.EventID, &wr.Seq}
	if check {
		dest = append(dest, &wake.did, &wake.fresh)
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return nil, wakeAnswer{}, fmt.Errorf("producer: read written events: %w", err)
		}
		out[index[wr.EventID]] = wr
		got++
	}
	if err := rows.Err(); err != nil {
		return nil, wakeAnswer{}, writeErr(err, events)
	}
	if got != n {
		if err := w.movedErr(ctx, tx, events); !errors.Is(err, errNotMoved) {
			return nil, wakeAnswer{}, err
		}
		return nil, wakeAnswer{}, fmt.Errorf("producer: insert events: %d of %d rows came back", got, n)
	}
	return out, wake, nil
}

// errNotMoved is movedErr's answer when no aggregate of the call moved.
var errNotMoved = errors.New("producer: no aggregate moved")

// movedErr explains a write that got fewer rows back than it wrote events:
// the upsert returns none for an aggregate moved to another shard. It is
// asked only then, so writes of aggregates that never moved pay nothing.
// It returns errNotMoved when none moved.
func (w *Writer) movedErr(ctx context.Context, tx pgx.Tx, events []Event) error {
	types := make([]string, len(events))
	ids := make([]string, len(events))
	for i := range events {
		types[i], ids[i] = events[i].AggregateType, events[i].AggregateID
	}
	var m MovedError
	err := tx.QueryRow(ctx, w.sql.Moved, types, ids).Scan(&m.AggregateType, &m.AggregateID, &m.To, &m.Arriving)
	if errors.Is(err, pgx.ErrNoRows) {
		return errNotMoved
	}
	if err != nil {
		return fmt.Errorf("producer: insert events: an aggregate may have moved to another shard, and looking it up failed: %w", err)
	}
	return &m
}

// sqlstateNumericValueOutOfRange is numeric_value_out_of_range.
const sqlstateNumericValueOutOfRange = "22003"

// writeErr explains an error of Write's statement. The statement's only
// arithmetic is on sequences, so a value out of range (SQLSTATE 22003) is
// a sequence that would pass the largest bigint. A prepared statement that
// does not exist or already exists (26000, 42P05) is pgx's statement cache
// behind a transaction pooler: the error names the fix.
func writeErr(err error, events []Event) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateNumericValueOutOfRange {
		var aggs []string
		seen := map[[2]string]bool{}
		for i := range events {
			k := [2]string{events[i].AggregateType, events[i].AggregateID}
			if !seen[k] {
				seen[k] = true
				aggs = append(aggs, k[0]+"/"+k[1])
			}
		}
		which := "aggregate " + aggs[0]
		if len(aggs) > 1 {
			which = "one of the aggregates " + strings.Join(aggs[:min(len(aggs), 5)], ", ")
			if len(aggs) > 5 {
				which += fmt.Sprintf(" and %d more", len(aggs)-5)
			}
		}
		return fmt.Errorf("%w: %s would pass sequence %d, the largest bigint, and no further event can be written for it; roll the transaction back (%w)",
			ErrSequenceExhausted, which, int64(math.MaxInt64), err)
	}
	if errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("producer: insert events: the transaction was already committed or rolled back: %w", err)
	}
	if isStatementCacheErr(err) {
		return fmt.Errorf("producer: insert events: %s: %w", statementCacheFix, err)
	}
	return fmt.Errorf("producer: insert events: %w", err)
}
