package deadletter_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/deadletter"
)

func TestReasons(t *testing.T) {
	t.Parallel()
	t.Run("ListsEachReasonOnceAndIsTheCallers", func(t *testing.T) {
		t.Parallel()
		rs := deadletter.Reasons()
		require.Equal(t, []deadletter.Reason{deadletter.ReasonHandler, deadletter.ReasonPanic, deadletter.ReasonTimeout,
			deadletter.ReasonSequence, deadletter.ReasonInput, deadletter.ReasonDeliveryLimit, deadletter.ReasonConflict}, rs)
		rs[0] = "changed"
		require.Equal(t, deadletter.ReasonHandler, deadletter.Reasons()[0])
	})
	t.Run("ParseReason", func(t *testing.T) {
		t.Parallel()
		for _, r := range deadletter.Reasons() {
			got, err := deadletter.ParseReason(string(r))
			require.NoError(t, err)
			require.Equal(t, r, got)
			require.True(t, r.Valid())
		}
		got, err := deadletter.ParseReason("")
		require.NoError(t, err, "the empty reason filters nothing")
		require.Empty(t, got)
		_, err = deadletter.ParseReason("Handler")
		require.EqualError(t, err, `deadletter: unknown reason "Handler"; want one of handler, panic, timeout, sequence, input, delivery_limit, conflict`)
		require.False(t, deadletter.Reason("").Valid())
	})
}
