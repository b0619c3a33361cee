package consumer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
)

// TestConflictingDuplicate: a record whose key was claimed by a record of
// another sequence or payload is dead-lettered as a conflict with both
// identities in its error, never skipped as a duplicate; a true
// redelivery stays a quiet duplicate, and a new key at an applied
// sequence (a fork) is dead-lettered too. Issue 34, item 3.
func TestConflictingDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	e := newEffects(t, db)
	p, err := consumer.Handle(db.Pool, "svc", consumer.HandlerFunc(e.Handle), fastConfig(db, 1))
	require.NoError(t, err)

	res := processAll(t, p, 1, rec("o", 1, "k1"), rec("o", 2, "k1"), rec("o", 1, "k1"), rec("o", 1, "fork1"))
	require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.DeadLettered, consumer.Duplicate, consumer.DeadLettered}, outcomes(res))

	var conflict *consumer.ConflictingDuplicateError
	require.ErrorAs(t, res[1].Err, &conflict)
	require.Equal(t, "k1", conflict.Key)
	require.Contains(t, conflict.Stored, "order/o@1 ")
	require.Contains(t, conflict.Got, "order/o@2 ")
	l, err := p.Inspector().Letter(ctx, res[1].DeadLetterID)
	require.NoError(t, err)
	require.Equal(t, deadletter.ReasonConflict, l.Reason)
	require.Contains(t, l.Error, conflict.Stored, "the letter shows the stored identity")
	require.Contains(t, l.Error, conflict.Got, "and the record's; the record is the letter's")

	var reused *consumer.SequenceReusedError
	require.ErrorAs(t, res[3].Err, &reused, "a new key at an applied sequence is a fork")
	require.Equal(t, []int64{1}, e.seqs(t, "o"))

	// The conflict holds its aggregate: what follows parks, alerted, until
	// an operator discards the letter, and then it is applied.
	res = processAll(t, p, 1, rec("o", 3, "k3"))
	require.Equal(t, consumer.Parked, res[0].Outcome)
	_, err = p.Discard(ctx, l.ID)
	require.NoError(t, err)
	require.Equal(t, []int64{1, 3}, e.seqs(t, "o"))
}
