package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/internal/tables"
)

// newMemberID names this process's member: host, pid and a random suffix,
// so that two Consumers of one name in one process are two members.
func newMemberID() (id, host string) {
	host, _ = os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b)), host
}

// memberLoop beats for the Consumer every MemberBeat until ctx ends, adds
// the records applied since the last beat to the minute's activity,
// prunes the members gone for a day and the activity over two days old
// once an hour, and removes the member's row when ctx ends. A failed beat
// is logged and tried again at the next: it is information, never a
// reason to stop applying records.
func (c *Consumer) memberLoop(ctx context.Context) {
	sql := tables.For(c.cfg.Schema).Members
	id, host := newMemberID()
	group := c.groupName()
	var (
		reported int64
		pruned   time.Time
	)
	beat := func(ctx context.Context) {
		c.mu.Lock()
		parts := len(c.lanes)
		c.mu.Unlock()
		applied := c.proc.appliedCount()
		b := &pgx.Batch{}
		b.Queue(sql.Beat, c.name, id, group, host, os.Getpid(), parts, applied)
		if d := applied - reported; d > 0 {
			b.Queue(sql.AddActivity, "applied", c.name, time.Now(), d)
		}
		if time.Since(pruned) > time.Hour {
			b.Queue(sql.PruneGone)
			b.Queue(sql.PruneActivity)
		}
		if err := sendBatch(ctx, c.db, b); err != nil {
			if ctx.Err() == nil {
				c.log.WarnContext(ctx, "consumer: could not record this member's heartbeat; the dashboard may show it gone",
					slog.String("member_id", id), slog.String("error", err.Error()))
			}
			return
		}
		reported = applied
		if time.Since(pruned) > time.Hour {
			pruned = time.Now()
		}
	}
	beat(ctx)
	every(ctx, MemberBeat, func() { beat(ctx) })
	// Run is ending: the last count, then the row goes.
	end, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	beat(end)
	if _, err := c.db.Exec(end, sql.Leave, c.name, id); err != nil {
		c.log.WarnContext(end, "consumer: could not remove this member's row; it shows gone after "+MemberGone.String(),
			slog.String("member_id", id), slog.String("error", err.Error()))
	}
}

// sendBatch runs b in one round trip, in a transaction of its own.
func sendBatch(ctx context.Context, db DB, b *pgx.Batch) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return tx.SendBatch(ctx, b).Close()
	})
}
