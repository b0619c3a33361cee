package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/ordering"
)

func TestNewInspector(t *testing.T) {
	t.Parallel()
	_, err := consumer.NewInspector(nil, "")
	require.ErrorContains(t, err, "nil db")
	db := pgtest.New(t, nil)
	_, err = consumer.NewInspector(db.Pool, strings.Repeat("s", 64))
	require.ErrorContains(t, err, "PostgreSQL keeps 63")
	in, err := consumer.NewInspector(db.Pool, "")
	require.NoError(t, err)
	_, err = in.Consumers(context.Background())
	require.ErrorContains(t, err, outbox.DefaultSchema, "\"\" is the default schema, not migrated in this test database")
}

// The Inspector reads one consumer's gaps, parked records, positions and
// dead letters by its name, from a pool or inside a transaction, and the
// Processor's Inspector is the one of its database and schema.
func TestInspectorReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	e := newEffects(t, db)
	e.setFail("bad", consumer.Permanent(errBroken))
	p, err := consumer.Handle(db.Pool, "svc", e, fastConfig(db, 1))
	require.NoError(t, err)
	other, err := consumer.Handle(db.Pool, "other", e, fastConfig(db, 1))
	require.NoError(t, err)
	// a: 2 is missing, 3 and 4 wait; bad: 1 is dead, 2 waits behind it.
	processAll(t, p, 1, rec("a", 1, "a1"), rec("a", 3, "a3"), rec("a", 4, "a4"), rec("bad", 1, "bad1"), rec("bad", 2, "bad2"))
	processAll(t, other, 1, rec("bad", 1, "bad1"), rec("c", 2, "c2"))
	a, bad := ordering.Aggregate{Type: "order", ID: "a"}, ordering.Aggregate{Type: "order", ID: "bad"}

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for _, in := range []*consumer.Inspector{p.Inspector(), mustInspector(t, tx, db.Schema)} {
		_, err := in.Gaps(ctx, nil)
		require.ErrorContains(t, err, "GapOpts.Consumer is empty")
		page, err := in.Gaps(ctx, &ordering.GapOpts{Consumer: "svc", Limit: 1})
		require.NoError(t, err)
		require.Len(t, page.Gaps, 1)
		require.Equal(t, a, page.Gaps[0].Aggregate)
		require.EqualValues(t, 2, page.Gaps[0].Expected)
		require.EqualValues(t, 3, page.Gaps[0].FirstParked)
		require.Equal(t, &a, page.Next)
		page, err = in.Gaps(ctx, &ordering.GapOpts{Consumer: "svc", After: page.Next})
		require.NoError(t, err)
		require.Len(t, page.Gaps, 1)
		require.Equal(t, bad, page.Gaps[0].Aggregate)
		require.NotZero(t, page.Gaps[0].DeadLetterID)
		require.Nil(t, page.Next)

		parked, err := in.Parked(ctx, "svc", a, 3, 0)
		require.NoError(t, err)
		require.Len(t, parked, 1)
		require.EqualValues(t, 4, parked[0].Seq)
		last, ok, err := in.Position(ctx, "svc", a)
		require.NoError(t, err)
		require.True(t, ok)
		require.EqualValues(t, 1, last)
		_, ok, err = in.Position(ctx, "other", a)
		require.NoError(t, err)
		require.False(t, ok)

		ls, err := in.Letters(ctx, &deadletter.ListOpts{Consumer: "svc"})
		require.NoError(t, err)
		require.Len(t, ls, 1)
		all, err := in.Letters(ctx, nil)
		require.NoError(t, err)
		require.Len(t, all, 2, "every consumer's")
		l, err := in.Letter(ctx, ls[0].ID)
		require.NoError(t, err)
		require.Equal(t, "bad1", l.IdempotencyKey)
		peek, err := in.PeekLetter(ctx, ls[0].ID)
		require.NoError(t, err)
		require.Equal(t, l.Record.Value, peek.Record.Value)
		_, err = in.Letter(ctx, 1<<40)
		require.ErrorIs(t, err, outbox.ErrNotFound)
		refs, err := in.MatchLetters(ctx, &deadletter.ListOpts{Status: deadletter.StatusDead})
		require.NoError(t, err)
		require.Len(t, refs, 2)
		pre, err := in.PreviewLetters(ctx, &deadletter.ListOpts{Consumer: "svc"})
		require.NoError(t, err)
		require.Equal(t, deadletter.Preview{Letters: 1, Aggregates: 1, Parked: 1}, pre)
		fs, err := in.Failures(ctx, "svc", 0)
		require.NoError(t, err)
		require.Len(t, fs, 1)
		require.Equal(t, ls[0].ID, fs[0].SampleID)
		_, err = in.Letters(ctx, &deadletter.ListOpts{Status: "gone"})
		require.ErrorContains(t, err, "unknown status")
	}
}

// Health counts what a consumer set aside (dead letters by topic and
// reason, parked records behind a gap) and the keys it keeps, and nothing
// of another consumer's.
func TestInspectorHealth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	e := newEffects(t, db)
	e.setFail("bad", consumer.Permanent(errBroken))
	e.panicOn["boom"] = true
	p, err := consumer.Handle(db.Pool, "svc", e, fastConfig(db, 1))
	require.NoError(t, err)
	other, err := consumer.Handle(db.Pool, "other", e, fastConfig(db, 1))
	require.NoError(t, err)

	in := mustInspector(t, db.Pool, db.Schema)
	empty, err := in.Health(ctx, "svc")
	require.NoError(t, err)
	require.Equal(t, consumer.Health{}, empty)

	processAll(t, p, 1, rec("a", 1, "a1"), rec("a", 3, "a3"), rec("a", 4, "a4"), rec("b", 2, "b2"),
		rec("bad", 1, "bad1"), rec("boom", 1, "boom1"))
	processAll(t, other, 1, rec("bad", 1, "bad1"))
	h, err := in.Health(ctx, "svc")
	require.NoError(t, err)
	require.Len(t, h.Letters, 2)
	require.Equal(t, deadletter.ReasonHandler, h.Letters[0].Reason)
	require.Equal(t, deadletter.ReasonPanic, h.Letters[1].Reason)
	for _, l := range h.Letters {
		require.Equal(t, "orders", l.Topic)
		require.EqualValues(t, 1, l.Count)
		require.Less(t, l.Oldest, time.Minute)
	}
	require.EqualValues(t, 2, h.ParkedAggregates, "a behind seq 2, b behind seq 1")
	require.EqualValues(t, 3, h.ParkedRecords)
	require.Positive(t, h.OldestGap)
	require.EqualValues(t, 4, h.ProcessedKeys, "a1 applied; a3, a4 and b2 parked")
	require.Positive(t, h.OldestKey)

	names, err := in.Consumers(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"other", "svc"}, names)
}
