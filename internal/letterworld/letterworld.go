// Package letterworld is the test world of a consumer with dead letters
// that the dashboard's and the command line's tests share: a migrated
// schema, a consumer "billing" whose handler fails for the aggregates told
// to, and order records fed to it one by one.
package letterworld

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// Consumer is the world's consumer's name.
const Consumer = "billing"

// World is one test's world.
type World struct {
	// DB is the test's schema and pool.
	DB *pgtest.DB
	// Proc is the consumer "billing" on DB.
	Proc *consumer.Processor

	mu sync.Mutex
	// fail maps an aggregate id to the error its records fail with.
	fail map[string]error
	// applied lists the records applied, as "aggregate:seq".
	applied []string
}

// New gives the test a world with no records yet. The consumer polls for
// operator requests every 20 ms when ServeRequests runs.
func New(t testing.TB) *World {
	t.Helper()
	w := &World{DB: pgtest.New(t, nil), fail: map[string]error{}}
	h := consumer.HandlerFunc(func(_ context.Context, _ pgx.Tx, m *consumer.Message) error {
		w.mu.Lock()
		defer w.mu.Unlock()
		if err := w.fail[m.AggregateID]; err != nil {
			return consumer.Permanent(err)
		}
		w.applied = append(w.applied, fmt.Sprintf("%s:%d", m.AggregateID, m.Seq))
		return nil
	})
	p, err := consumer.Handle(w.DB.Pool, Consumer, h, &consumer.Config{Schema: w.DB.Schema, RequestPoll: 20 * time.Millisecond})
	require.NoError(t, err)
	w.Proc = p
	return w
}

// SetFail makes agg's records fail with err from now on (nil: succeed).
func (w *World) SetFail(agg string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fail[agg] = err
}

// Applied returns the records applied so far, as "aggregate:seq", in the
// order they were.
func (w *World) Applied() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.applied)
}

// AppliedOf returns the records of aggregate agg applied so far.
func (w *World) AppliedOf(agg string) []string {
	return slices.DeleteFunc(w.Applied(), func(s string) bool { return !strings.HasPrefix(s, agg+":") })
}

// Process feeds the consumer seqs of aggregate agg (type "order", event id
// "evt-<agg>-<seq>", offset seq) with value as the payload.
func (w *World) Process(t testing.TB, agg string, value string, seqs ...int64) {
	t.Helper()
	for _, seq := range seqs {
		r := producer.Record("orders", producer.Event{AggregateType: "order", AggregateID: agg, EventType: "order.changed", Payload: []byte(value),
			Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
			producer.Stamp{EventID: fmt.Sprintf("evt-%s-%d", agg, seq), Seq: seq})
		r.Offset = seq
		_, err := w.Proc.Process(context.Background(), r)
		require.NoError(t, err)
	}
}

// Letters seeds the usual letters: aggregate o-1 fails at seq 1 (a letter,
// with 2 and 3 parked behind it), o-2 fails another way at seq 1.
func (w *World) Letters(t testing.TB) {
	t.Helper()
	w.SetFail("o-1", errors.New("card processor down"))
	w.SetFail("o-2", errors.New("address has no postcode"))
	w.Process(t, "o-1", `{"order":"o-1","total_cents":1999}`, 1, 2, 3)
	w.Process(t, "o-2", `{"order":"o-2"}`, 1)
}

// ServeRequests runs the consumer's ServeRequests until the test ends.
func (w *World) ServeRequests(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Proc.ServeRequests(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}
