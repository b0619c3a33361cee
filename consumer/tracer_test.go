package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
)

// counter is a metrics adapter in miniature: it counts outcomes, checks
// that each start is ended once with its own context, and marks the
// context so that the handler can tell it runs inside a span.
type counter struct {
	mu       sync.Mutex
	outcomes map[consumer.Outcome]int
	undone   int
	open     map[*kgo.Record]int
	batches  int
	problems []string
}

type spanKey struct{}

func (c *counter) TraceRecordStart(ctx context.Context, rec *kgo.Record) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open[rec]++
	return context.WithValue(ctx, spanKey{}, rec)
}

func (c *counter) TraceRecordEnd(ctx context.Context, rec *kgo.Record, res consumer.Result, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ctx.Value(spanKey{}) != rec {
		c.problems = append(c.problems, "ended with another context than its start's")
	}
	if c.open[rec]--; c.open[rec] < 0 {
		c.problems = append(c.problems, "ended more often than started")
	}
	if err != nil {
		c.undone++
		return
	}
	c.outcomes[res.Outcome]++
}

// batchCounter is counter as a BatchTracer.
type batchCounter struct{ *counter }

type batchKey struct{}

func (c batchCounter) TraceBatchStart(ctx context.Context, recs []*kgo.Record) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batches++
	return context.WithValue(ctx, batchKey{}, len(recs))
}

func (c batchCounter) TraceBatchEnd(ctx context.Context, recs []*kgo.Record, res []consumer.Result, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ctx.Value(batchKey{}) != len(recs) {
		c.problems = append(c.problems, "batch ended with another context than its start's")
	}
}

// inSpan fails the handler unless its ctx is one a start returned: a
// record's in single mode, the batch's in batch mode.
func inSpan(batch bool, next consumer.Handler) consumer.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if batch && ctx.Value(batchKey{}) == nil || !batch && ctx.Value(spanKey{}) == nil {
			return consumer.Permanent(errors.New("handler runs outside the tracer's context"))
		}
		return next.Handle(ctx, tx, m)
	}
}

// Every record is started and ended once with its outcome, whichever path
// it took (a batch's happy path, its record-by-record fallback, a dead
// letter), and the handler runs inside the started context.
func TestTracerSeesEveryRecordOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, nil)
			e := newEffects(t, db)
			e.setFail("bad", consumer.Permanent(errBroken))
			c := &counter{outcomes: map[consumer.Outcome]int{}, open: map[*kgo.Record]int{}}
			cfg := fastConfig(db, mode.batch)
			cfg.Tracer = c
			if mode.batch > 1 {
				cfg.Tracer = batchCounter{c}
			}
			p, err := consumer.Handle(db.Pool, "svc", inSpan(mode.batch > 1, e), cfg)
			require.NoError(t, err)
			processAll(t, p, mode.batch,
				rec("a", 1, "a1"), rec("a", 1, "a1"), rec("a", 3, "a3"), rec("a", 2, "a2"),
				rec("bad", 0, "x"), rec("b", 1, "b1"), rec("b", 2, "b2"))
			require.Equal(t, map[consumer.Outcome]int{
				consumer.Applied: 4, consumer.Duplicate: 1, consumer.Parked: 1, consumer.DeadLettered: 1,
			}, c.outcomes)
			require.Zero(t, c.undone)
			require.Empty(t, c.problems)
			for _, n := range c.open {
				require.Zero(t, n, "a record started and not ended")
			}
			if mode.batch > 1 {
				require.Positive(t, c.batches)
			}
		})
	}
}
