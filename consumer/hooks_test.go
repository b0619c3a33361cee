package consumer_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
)

// counter is a metrics adapter in miniature.
type counter struct {
	mu       sync.Mutex
	outcomes map[consumer.Outcome]int
	undone   int
}

func (c *counter) OnRecord(_ context.Context, _ *kgo.Record, res consumer.Result, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.undone++
		return
	}
	c.outcomes[res.Outcome]++
}

// Every record is reported once with its outcome, whichever path it took
// (a batch's happy path, its record-by-record fallback, a dead letter).
func TestHooksCountEveryRecordOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, nil)
			e := newEffects(t, db)
			e.setFail("bad", consumer.Permanent(errBroken))
			c := &counter{outcomes: map[consumer.Outcome]int{}}
			cfg := fastConfig(db, mode.batch)
			cfg.Hooks = c
			p, err := consumer.Handle(db.Pool, "svc", mode.handler(e), cfg)
			require.NoError(t, err)
			processAll(t, p, mode.batch,
				rec("a", 1, "a1"), rec("a", 1, "a1"), rec("a", 3, "a3"), rec("a", 2, "a2"),
				rec("bad", 0, "x"), rec("b", 1, "b1"), rec("b", 2, "b2"))
			require.Equal(t, map[consumer.Outcome]int{
				consumer.Applied: 4, consumer.Duplicate: 1, consumer.Parked: 1, consumer.DeadLettered: 1,
			}, c.outcomes)
			require.Zero(t, c.undone)
		})
	}
}
