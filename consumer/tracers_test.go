package consumer_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
)

func newCounter() *counter {
	return &counter{outcomes: map[consumer.Outcome]int{}, open: map[*kgo.Record]int{}}
}

// Tracers is a BatchTracer exactly when one of its tracers is; it leaves
// out nil tracers and returns a single one as it is.
func TestTracersBatchWhenOneIs(t *testing.T) {
	t.Parallel()
	require.Nil(t, consumer.Tracers())
	require.Nil(t, consumer.Tracers(nil))
	one := newCounter()
	require.Same(t, one, consumer.Tracers(nil, one))
	_, batch := consumer.Tracers(newCounter(), newCounter()).(consumer.BatchTracer)
	require.False(t, batch, "no tracer observes batches, so neither does the fan-out")
	_, batch = consumer.Tracers(newCounter(), batchCounter{newCounter()}).(consumer.BatchTracer)
	require.True(t, batch)
	_, batch = consumer.Tracers(newCounter(), consumer.Tracers(newCounter(), batchCounter{newCounter()})).(consumer.BatchTracer)
	require.True(t, batch, "a fan-out among the tracers counts as its tracers")
}

// Two tracers through Tracers each see every record once with its
// outcome and their own start's context, a batch tracer among them its
// batches, and the handler runs in a context both contributed to.
func TestTracersSeeEveryRecordOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, nil)
			e := newEffects(t, db)
			e.setFail("bad", consumer.Permanent(errBroken))
			first, second := newCounter(), newCounter()
			var firstTracer consumer.Tracer = first
			if mode.batch > 1 {
				firstTracer = batchCounter{first}
			}
			cfg := fastConfig(db, mode.batch)
			cfg.Tracer = consumer.Tracers(firstTracer, second)
			p, err := consumer.Handle(db.Pool, "svc", inSpan(mode.batch > 1, e), cfg)
			require.NoError(t, err)
			processAll(t, p, mode.batch,
				rec("a", 1, "a1"), rec("a", 1, "a1"), rec("a", 3, "a3"), rec("a", 2, "a2"),
				rec("bad", 0, "x"), rec("b", 1, "b1"), rec("b", 2, "b2"))
			for _, c := range []*counter{first, second} {
				require.Equal(t, map[consumer.Outcome]int{
					consumer.Applied: 4, consumer.Duplicate: 1, consumer.Parked: 1, consumer.DeadLettered: 1,
				}, c.outcomes)
				require.Zero(t, c.undone)
				require.Empty(t, c.problems)
				for _, n := range c.open {
					require.Zero(t, n, "a record started and not ended")
				}
			}
			if mode.batch > 1 {
				require.Positive(t, first.batches)
			}
		})
	}
}
