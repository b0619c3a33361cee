package producer

import (
	"context"
	"fmt"
	"time"

	"github.com/d419a114/outbox"
)

// Health is the producer side's state, as read from the health view.
//
// Alert on OldestUndelivered (say, over five minutes) and on Dead > 0, not
// on Undelivered: a large backlog that drains fast is healthy, and a single
// event stuck for an hour is not. Age rising while the broker's lag is flat
// points at the relay; both rising points at the broker or the consumers.
type Health struct {
	// Undelivered counts events not yet acknowledged by the broker.
	Undelivered int64
	// OldestUndelivered is the age of the oldest undelivered event; zero
	// when there is none.
	OldestUndelivered time.Duration
	// Dead counts events that exhausted their attempts and wait for a
	// replay or discard.
	Dead int64
}

// ReadHealth reads the health view of schema ("" means
// outbox.DefaultSchema). The same numbers are one SELECT away for a
// monitoring agent: SELECT * FROM outbox.health.
func ReadHealth(ctx context.Context, db DB, schema string) (Health, error) {
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	var h Health
	var oldest float64
	err := db.QueryRow(ctx, qualify(`SELECT undelivered, oldest_undelivered_seconds, dead FROM {schema}.health`, schema)).
		Scan(&h.Undelivered, &oldest, &h.Dead)
	if err != nil {
		return Health{}, fmt.Errorf("producer: read health: %w", err)
	}
	h.OldestUndelivered = time.Duration(oldest * float64(time.Second))
	return h, nil
}
