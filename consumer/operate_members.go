package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/internal/tables"
)

// MemberBeat is how often a running Consumer records in its database that
// it is alive, with its assigned partitions and the records it applied;
// MemberGone is how old its last beat may be before it counts as gone.
const (
	MemberBeat = 5 * time.Second
	MemberGone = 30 * time.Second
)

// maxMembers bounds Members.
const maxMembers = 200

// Member is a running Consumer as its beats show it.
type Member struct {
	Consumer string `json:"consumer"`
	// ID names the process: its host, its pid and a random suffix.
	ID         string    `json:"member_id"`
	Group      string    `json:"group"`
	Host       string    `json:"host"`
	PID        int       `json:"pid"`
	Partitions int       `json:"partitions"`
	Applied    int64     `json:"applied"`
	StartedAt  time.Time `json:"started_at"`
	// HeartbeatAt is its last beat; Live says it was within MemberGone.
	HeartbeatAt time.Time `json:"heartbeat_at"`
	Live        bool      `json:"live"`
}

// Members lists the members of consumer ("" means every consumer), newest
// beat first, at most 200:
// the processes running a Consumer now, and those that stopped without
// saying so less than a day ago (Live false). A Consumer that stops
// cleanly removes its row.
func (in *Inspector) Members(ctx context.Context, consumer string) ([]Member, error) {
	rows, err := in.db.Query(ctx, in.sql.Members.List, tables.Filter(consumer), maxMembers, MemberGone.Seconds())
	if err != nil {
		return nil, fmt.Errorf("consumer: list members (did Migrate run?): %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Member, error) {
		var m Member
		err := r.Scan(&m.Consumer, &m.ID, &m.Group, &m.Host, &m.PID, &m.Partitions, &m.Applied, &m.StartedAt, &m.HeartbeatAt, &m.Live)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: list members: %w", err)
	}
	return list, nil
}
