package move

import (
	"context"
	"fmt"
	"time"

	"github.com/d419a114/outbox/internal/tables"
)

// State is where a move got to.
type State string

// A move's states, in order; RolledBack ends a move instead of Done.
const (
	// Prepared: the target refuses writes of the aggregates, naming the
	// source, which still takes them.
	Prepared State = "prepared"
	// Closed: the source refuses writes of the aggregates; the target is
	// not open yet.
	Closed State = "closed"
	// Arriving: the target takes writes and holds their events while the
	// source delivers the earlier ones.
	Arriving State = "arriving"
	// Done: the target publishes the aggregates' events.
	Done State = "done"
	// RolledBack: Resume reopened the aggregates on the source.
	RolledBack State = "rolled_back"
)

// Status is what Status reports of a move.
type Status struct {
	ID    string
	State State
	// Aggregates is how many aggregates the move takes.
	Aggregates int
	// Undelivered counts the source's events of the aggregates that the
	// move waits for (while Arriving).
	Undelivered int64
	// Held counts the target's events held until the release, and
	// HeldSince is when the oldest of them was written (zero when none).
	Held      int64
	HeldSince time.Time
}

// String says where the move got to, in one line.
func (s Status) String() string {
	return fmt.Sprintf("move %s: %s, %d aggregate(s), %d undelivered on the source, %d held on the target",
		s.ID, s.State, s.Aggregates, s.Undelivered, s.Held)
}

// Get reads the status of move id from the records on both shards. It
// returns ErrUnknownMove when neither has a record of id.
func Get(ctx context.Context, id string, from, to Endpoint) (Status, error) {
	m, err := newMover(from, to, nil)
	if err != nil {
		return Status{}, err
	}
	m.id = id
	out, err := m.records(ctx, from.DB, m.fromSQL, "out")
	if err != nil {
		return Status{}, err
	}
	in, err := m.records(ctx, to.DB, m.toSQL, "in")
	if err != nil {
		return Status{}, err
	}
	if len(out) == 0 && len(in) == 0 {
		return Status{}, fmt.Errorf("%w: %s on shards %q and %q", ErrUnknownMove, id, from.Shard.Name, to.Shard.Name)
	}
	st := Status{ID: id, Aggregates: max(len(in), len(out))}
	switch {
	case len(out) > 0 && out[0].state == string(RolledBack):
		st.State = RolledBack
	case len(in) > 0 && in[0].state != string(Prepared):
		st.State = State(in[0].state)
	case len(out) > 0:
		st.State = State(out[0].state)
	default:
		st.State = Prepared
	}
	if st.State == Closed || st.State == Arriving {
		// Counted from the source's records, which exist from Closed on.
		if err := from.DB.QueryRow(ctx, m.fromSQL.Undelivered, id).Scan(&st.Undelivered); err != nil {
			return Status{}, fmt.Errorf("move %s: count undelivered events on shard %q: %w", id, from.Shard.Name, err)
		}
	}
	var since *time.Time
	if err := to.DB.QueryRow(ctx, m.toSQL.Status, id, tables.HeldPrefix+"%").Scan(&st.Held, &since); err != nil {
		return Status{}, fmt.Errorf("move %s: count held events on shard %q: %w", id, to.Shard.Name, err)
	}
	if since != nil {
		st.HeldSince = *since
	}
	return st, nil
}
