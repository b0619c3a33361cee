package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
)

// DefaultMaxPayloadBytes is the payload limit unless WriterConfig says
// otherwise: Kafka's default max.message.bytes is about 1 MiB.
const DefaultMaxPayloadBytes = 1 << 20

// WriterConfig tunes a Writer. The zero value is valid.
type WriterConfig struct {
	// Schema holds the outbox tables. Default outbox.DefaultSchema.
	Schema string
	// MaxPayloadBytes refuses larger payloads before anything is written.
	// Keep it under what the relay can send: the topic's max.message.bytes
	// and the client's kgo.ProducerBatchMaxBytes (franz-go's default is
	// 1,000,012 bytes, a little under the 1 MiB default here), less room
	// for headers; an event over them goes to the dead events. Default
	// DefaultMaxPayloadBytes (1 MiB).
	MaxPayloadBytes int
}

// Writer inserts events into the outbox inside the caller's transaction.
// It holds no connection and is safe for concurrent use.
type Writer struct {
	maxPayload int
	insertSQL  string
	insertOne  string
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
	maxPayload := cfg.MaxPayloadBytes
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayloadBytes
	}
	return &Writer{maxPayload: maxPayload, insertSQL: qualify(insertEventsSQL, schema), insertOne: qualify(insertEventSQL, schema)}
}

var defaultWriter = NewWriter(nil)

// Write inserts events with the default WriterConfig; see Writer.Write.
func Write(ctx context.Context, tx pgx.Tx, events ...Event) ([]Written, error) {
	return defaultWriter.Write(ctx, tx, events...)
}

// insertEventsSQL writes a whole call in one round trip.
//
// The sequences upsert runs first and locks each aggregate's row in
// (aggregate_type, aggregate_id) order; a concurrent writer of the same
// aggregate waits there until this transaction ends, so sequence order is
// commit order, and the sorted order keeps two multi-aggregate writers from
// deadlocking each other. Events of one aggregate in one call get
// consecutive numbers, in call order. Ids are drawn after the lock, so they
// rise with the sequence too. The relay is woken by a trigger at commit.
const insertEventsSQL = `
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::text[], $8::bytea[], $9::text[]) WITH ORDINALITY
        AS i(event_id, idempotency_key, aggregate_type, aggregate_id, event_type,
             topic, content_type, payload, headers, ord)
), counts AS (
    SELECT aggregate_type, aggregate_id, count(*) AS n
    FROM input GROUP BY aggregate_type, aggregate_id
), bumped AS (
    INSERT INTO {schema}.sequences AS s (aggregate_type, aggregate_id, last_seq)
    SELECT aggregate_type, aggregate_id, n FROM counts ORDER BY aggregate_type, aggregate_id
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = s.last_seq + excluded.last_seq
    RETURNING aggregate_type, aggregate_id, last_seq
)
INSERT INTO {schema}.events (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
                             event_type, topic, content_type, payload, headers)
SELECT i.event_id::uuid, i.idempotency_key, i.aggregate_type, i.aggregate_id,
       b.last_seq - c.n + row_number() OVER (PARTITION BY i.aggregate_type, i.aggregate_id ORDER BY i.ord),
       i.event_type, nullif(i.topic, ''), nullif(i.content_type, ''), i.payload, i.headers::jsonb
FROM input i
JOIN counts c USING (aggregate_type, aggregate_id)
JOIN bumped b USING (aggregate_type, aggregate_id)
ORDER BY i.ord
RETURNING id, event_id::text, aggregate_seq`

// insertEventSQL is insertEventsSQL for the common single event: the same
// locking, without the array unpacking, grouping and window function, which
// cost more than the inserts themselves.
const insertEventSQL = `
WITH bumped AS (
    INSERT INTO {schema}.sequences AS s (aggregate_type, aggregate_id, last_seq)
    VALUES ($3, $4, 1)
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = s.last_seq + 1
    RETURNING last_seq
)
INSERT INTO {schema}.events (event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq,
                             event_type, topic, content_type, payload, headers)
SELECT $1::uuid, $2, $3, $4, last_seq, $5, nullif($6, ''), nullif($7, ''), $8, $9::jsonb
FROM bumped
RETURNING id, event_id::text, aggregate_seq`

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
// Invalid input is refused with a *ValidationError before anything is sent
// to the database. A nil tx returns ErrNoTx; a finished one returns an error
// wrapping pgx.ErrTxClosed.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, events ...Event) ([]Written, error) {
	if tx == nil {
		return nil, ErrNoTx
	}
	if len(events) == 0 {
		return nil, nil
	}
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
		if err := e.validate(i, w.maxPayload); err != nil {
			return nil, err
		}
		id := uuidV7()
		eventIDs[i], aggTypes[i], aggIDs[i], eventTypes[i] = id, e.AggregateType, e.AggregateID, e.EventType
		topics[i], contentTypes[i] = e.Topic, e.ContentType
		keys[i] = e.IdempotencyKey
		if keys[i] == "" {
			keys[i] = id
		}
		payloads[i] = e.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		headers[i] = "{}"
		if len(e.Headers) > 0 {
			b, err := json.Marshal(e.Headers)
			if err != nil {
				return nil, fmt.Errorf("producer: encode headers of event %d: %w", i, err)
			}
			headers[i] = string(b)
		}
		index[id] = i
	}
	if n == 1 {
		var wr Written
		err := tx.QueryRow(ctx, w.insertOne, eventIDs[0], keys[0], aggTypes[0], aggIDs[0], eventTypes[0], topics[0], contentTypes[0], payloads[0], headers[0]).
			Scan(&wr.ID, &wr.EventID, &wr.Seq)
		if err != nil {
			return nil, writeErr(err)
		}
		return []Written{wr}, nil
	}
	rows, err := tx.Query(ctx, w.insertSQL, eventIDs, keys, aggTypes, aggIDs, eventTypes, topics, contentTypes, payloads, headers)
	if err != nil {
		return nil, writeErr(err)
	}
	out := make([]Written, n)
	var got int
	for rows.Next() {
		var wr Written
		if err := rows.Scan(&wr.ID, &wr.EventID, &wr.Seq); err != nil {
			rows.Close()
			return nil, fmt.Errorf("producer: read written events: %w", err)
		}
		out[index[wr.EventID]] = wr
		got++
	}
	if err := rows.Err(); err != nil {
		return nil, writeErr(err)
	}
	if got != n {
		return nil, fmt.Errorf("producer: insert events: %d of %d rows came back", got, n)
	}
	return out, nil
}

func writeErr(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("producer: insert events: the transaction was already committed or rolled back: %w", err)
	}
	return fmt.Errorf("producer: insert events: %w", err)
}

// qualify puts the quoted schema where sql says {schema}. The schema is
// configuration, quoted by pgx.Identifier; no other input reaches SQL text.
func qualify(sql, schema string) string {
	return strings.ReplaceAll(sql, "{schema}", pgx.Identifier{schema}.Sanitize())
}
