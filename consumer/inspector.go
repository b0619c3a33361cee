package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/letters"
	"github.com/d419a114/outbox/internal/sequence"
	"github.com/d419a114/outbox/internal/tables"
	"github.com/d419a114/outbox/ordering"
)

// Inspector reads the state of one schema's consumer tables: what an
// operator, a dashboard or a monitoring agent asks about the consumers
// that keep their processed keys, positions, parked records and dead
// letters there. It only reads; the verbs (Replay, Discard, ResolveGap,
// DrainReady, PruneKeys) are Processor's, and a running Consumer's own
// account of its work is its Tracer. Every read that concerns one consumer
// takes its name. It is safe for concurrent use when its DB is (a pool is;
// a pgx.Conn or pgx.Tx is not).
type Inspector struct {
	db      outbox.DB
	schema  string
	sql     *tables.Consumer
	letters *letters.Store
}

// NewInspector returns the Inspector of schema ("" means
// outbox.DefaultSchema) in db: a *pgxpool.Pool, or a *pgx.Conn or pgx.Tx
// for reads inside one session or transaction. It reads nothing yet, so a
// schema that is not migrated shows in the first read's error. It refuses a
// nil db and a schema name longer than PostgreSQL keeps. [Processor.Inspector]
// returns the one of a Processor's database and schema.
func NewInspector(db outbox.DB, schema string) (*Inspector, error) {
	if db == nil {
		return nil, errors.New("consumer: NewInspector: nil db; pass the pool (or conn, or tx) of the database that holds the consumer tables")
	}
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	if err := tables.CheckSchema(schema); err != nil {
		return nil, fmt.Errorf("consumer: NewInspector: %w", err)
	}
	return newInspector(db, schema), nil
}

// newInspector is NewInspector for a db and schema checked already.
func newInspector(db outbox.DB, schema string) *Inspector {
	sql := tables.For(schema)
	return &Inspector{db: db, schema: schema, sql: sql, letters: letters.New(sql.DeadLetters)}
}

// Consumers returns the names of the consumers that have kept anything in
// the schema: processed keys, positions, dead letters or parked records.
func (in *Inspector) Consumers(ctx context.Context) ([]string, error) {
	rows, err := in.db.Query(ctx, in.sql.Reads.Consumers)
	if err != nil {
		return nil, fmt.Errorf("consumer: list the consumers of schema %q: %w", in.schema, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("consumer: list the consumers of schema %q: %w", in.schema, err)
	}
	return names, nil
}

// Gaps returns a page of the gaps of opts.Consumer (required): the
// aggregates with records parked behind a missing sequence (or behind an
// open dead letter inside the gap), in (type, id) order, read along an
// index of those aggregates, so that a page costs the same however many
// records are parked. Page on with opts.After set to the page's Next. A
// gap's Since is when its lowest parked record was parked. An aggregate
// held only by an open dead letter beyond its next sequence, with nothing
// parked, is not a gap here: its letter is among the dead letters.
// [Processor.ResolveGap] resolves a gap.
func (in *Inspector) Gaps(ctx context.Context, opts *ordering.GapOpts) (ordering.GapPage, error) {
	return sequence.ListGaps(ctx, in.db, in.sql.Parked, opts)
}

// Parked returns up to limit (default 100) of consumer's parked records
// of agg with a sequence above afterSeq, in sequence order: the records a
// resolved gap would release, for an operator to look at; page on with the
// last one's Seq. Each Record holds the first 256 bytes of its key and
// value and no headers: it is a listing, bounded whatever the records
// hold.
func (in *Inspector) Parked(ctx context.Context, consumer string, agg ordering.Aggregate, afterSeq int64, limit int) ([]ordering.Parked, error) {
	return sequence.ListParked(ctx, in.db, in.sql.Parked, consumer, agg, afterSeq, limit)
}

// Position returns the last sequence of agg that consumer applied, and
// false when it has applied none.
func (in *Inspector) Position(ctx context.Context, consumer string, agg ordering.Aggregate) (int64, bool, error) {
	return sequence.Position(ctx, in.db, in.sql.Positions, consumer, agg)
}
