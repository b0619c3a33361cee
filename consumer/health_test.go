package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
)

// ReadHealth counts what a consumer set aside (dead letters by topic and
// reason, parked records behind a gap) and the keys it keeps, and nothing
// of another consumer's.
func TestReadHealth(t *testing.T) {
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

	empty, err := consumer.ReadHealth(ctx, db.Pool, db.Schema, "svc")
	require.NoError(t, err)
	require.Equal(t, consumer.Health{}, empty)

	processAll(t, p, 1, rec("a", 1, "a1"), rec("a", 3, "a3"), rec("a", 4, "a4"), rec("b", 2, "b2"),
		rec("bad", 1, "bad1"), rec("boom", 1, "boom1"))
	processAll(t, other, 1, rec("bad", 1, "bad1"))
	h, err := consumer.ReadHealth(ctx, db.Pool, db.Schema, "svc")
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

	names, err := consumer.Consumers(ctx, db.Pool, db.Schema)
	require.NoError(t, err)
	require.Equal(t, []string{"other", "svc"}, names)
}
