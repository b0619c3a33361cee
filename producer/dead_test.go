package producer_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
)

func TestDeadEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("dead_events")+` (id, event_id, idempotency_key, aggregate_type, aggregate_id,
		aggregate_seq, event_type, payload, headers, created_at, attempts, last_error, hold, status)
		VALUES (7, gen_random_uuid(), 'k7', 'order', 'a', 1, 'placed', 'p', '{}', now(), 3, 'MESSAGE_TOO_LARGE', true, 'dead'),
		       (8, gen_random_uuid(), 'k8', 'order', 'b', 1, 'placed', 'p', '{}', now(), 3, 'MESSAGE_TOO_LARGE', true, 'discarded')`)
	require.NoError(t, err)
	in, dead := inspector(t, db), deadEvents(t, db)

	t.Run("ListTakesTheLettersFilterAndRefusesWhatDoesNotApply", func(t *testing.T) {
		t.Parallel()
		list, err := in.DeadEvents(ctx, &deadletter.ListOpts{Status: deadletter.StatusDead, AggregateType: "order"})
		require.NoError(t, err)
		require.Len(t, list, 1)
		e := list[0]
		require.Equal(t, int64(7), e.ID)
		require.Equal(t, deadletter.StatusDead, e.Status)
		require.Equal(t, "MESSAGE_TOO_LARGE", e.Error)
		require.False(t, e.LastFailedAt.IsZero())

		_, err = in.DeadEvents(ctx, &deadletter.ListOpts{Consumer: "svc", Reason: deadletter.ReasonHandler})
		require.EqualError(t, err, "producer: list dead events: ListOpts.Consumer, ListOpts.Reason filters only a consumer's dead letters; "+
			"filter dead events by Status, AggregateType and AggregateID")
		_, err = in.DeadEvents(ctx, &deadletter.ListOpts{Status: "gone"})
		require.ErrorContains(t, err, `unknown status "gone"`)
	})

	t.Run("PagesByIDAndReadsOneWhole", func(t *testing.T) {
		t.Parallel()
		page, err := in.DeadEvents(ctx, &deadletter.ListOpts{Limit: 1})
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, int64(7), page[0].ID)
		page, err = in.DeadEvents(ctx, &deadletter.ListOpts{AfterID: page[0].ID, Limit: 1, Brief: true})
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, int64(8), page[0].ID)
		require.Nil(t, page[0].Headers, "a brief page reads no headers")
		page, err = in.DeadEvents(ctx, &deadletter.ListOpts{AfterID: 8})
		require.NoError(t, err)
		require.Empty(t, page)

		e, err := in.DeadEvent(ctx, 8)
		require.NoError(t, err)
		require.Equal(t, deadletter.StatusDiscarded, e.Status, "any status")
		require.NotNil(t, e.Headers, "whole")
		require.Equal(t, []byte("p"), e.Payload)
	})

	t.Run("JSONNamesAreTheLettersNames", func(t *testing.T) {
		t.Parallel()
		e, err := in.DeadEvent(ctx, 7)
		require.NoError(t, err)
		b, err := json.Marshal(e)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		for _, k := range []string{"seq", "error", "attempts", "status", "last_failed_at"} {
			require.Contains(t, m, k)
		}
	})

	t.Run("ReadAndResolveSayNotFoundOrResolved", func(t *testing.T) {
		t.Parallel()
		_, err := in.DeadEvent(ctx, 9)
		require.ErrorIs(t, err, outbox.ErrNotFound)
		require.EqualError(t, err, "producer: dead event 9: outbox: not found")
		err = dead.Replay(ctx, db.Pool, 9)
		require.ErrorIs(t, err, outbox.ErrNotFound)
		err = dead.Discard(ctx, db.Pool, 8)
		require.ErrorIs(t, err, deadletter.ErrResolved)
		require.NotErrorIs(t, err, outbox.ErrNotFound)
		require.ErrorContains(t, err, "producer: discard dead event 8: it is discarded")
	})
}
