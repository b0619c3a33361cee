package consumer

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/ordering"
)

func panicked(f func()) (pe *PanicError) {
	defer func() {
		if r := recover(); r != nil {
			pe = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	f()
	return nil
}

func indexOutOfRange(i int) int { return []int{1}[i] }

func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := errors.New("downstream broken")
	tests := []struct {
		name     string
		err      error
		attempts int
		reason   deadletter.Reason
		failure  string
	}{
		{"Handler", fmt.Errorf("charge order 42 of %q: %w", "alice", base), 3, deadletter.ReasonHandler,
			`handler: charge order N of "…": downstream broken`},
		{"HandlerTyped", fmt.Errorf("insert: %w", &typedError{}), 1, deadletter.ReasonHandler, "handler *consumer.typedError: insert: typed"},
		{"Timeout", &HandlerTimeoutError{Timeout: time.Second, Err: errors.New("ctx")}, 5, deadletter.ReasonTimeout, "timeout after 1s"},
		{"DeliveryLimit", fmt.Errorf("%w (delivery 5 of 5): %w", ErrDeliveryLimit, base), 0, deadletter.ReasonDeliveryLimit, "delivery_limit"},
		{"Sequence", &SequenceReusedError{Aggregate: ordering.Aggregate{Type: "order", ID: "o-7"}, Seq: 3, Position: 9}, 1, deadletter.ReasonSequence, ""},
		{"Input", fmt.Errorf("consumer: header outbox-aggregate-seq %q is not a number", "x1"), 0, deadletter.ReasonInput,
			`input: consumer: header outbox-aggregate-seq "…" is not a number`},
		{"Panic", panicked(func() { indexOutOfRange(7) }), 1, deadletter.ReasonPanic, "panic runtime.boundsError at github.com/d419a114/outbox/consumer.indexOutOfRange"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reason, failure := fingerprint(tt.err, tt.attempts)
			require.Equal(t, tt.reason, reason)
			require.True(t, reason.Valid(), "every reason the consumer writes is one of deadletter.Reasons")
			if tt.failure != "" {
				require.Equal(t, tt.failure, failure)
			}
		})
	}

	t.Run("TheSameFaultInOtherRecordsGroups", func(t *testing.T) {
		t.Parallel()
		_, a := fingerprint(fmt.Errorf("order 1 total -5: %w", base), 1)
		_, b := fingerprint(fmt.Errorf("order 977 total -12: %w", base), 5)
		require.Equal(t, a, b)
		_, c := fingerprint(panicked(func() { indexOutOfRange(3) }), 1)
		_, d := fingerprint(panicked(func() { indexOutOfRange(9) }), 1)
		require.Equal(t, c, d)
		_, e := fingerprint(panicked(func() { panic("other") }), 1)
		require.NotEqual(t, c, e)
	})

	t.Run("LongWordingIsCutAtARune", func(t *testing.T) {
		t.Parallel()
		_, f := fingerprint(errors.New(strings.Repeat("é", 200)), 1)
		require.LessOrEqual(t, len(f), len("handler: ")+maxFailure)
		require.True(t, strings.HasSuffix(f, "é"))
	})
}

type typedError struct{}

func (*typedError) Error() string { return "typed" }
