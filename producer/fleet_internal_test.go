package producer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
)

// TestModelSharedLockSession is the model-based test of a lock session
// shared by the owners of three schemas, as a Fleet's shards share one:
// rapid draws rebalances, claims (each after a write of a fresh
// aggregate), the death of the session (terminated by the server) and
// shards leaving and joining again. The model is which owners held
// buckets in a session that has died since: such an owner must forget them
// in its next turn, before it claims anything.
//
// After every step:
//   - every bucket an owner counts as owned and claimable is locked, under
//     its schema's key, by the session's live connection (pg_locks);
//   - a claim by an owner whose buckets died with a session returns
//     nothing, and the owner owns nothing until it rebalances;
//   - a claim by an owner holding buckets returns the event just written
//     when its bucket is one of them;
//   - an owner that left holds no lock on the live session.
func TestModelSharedLockSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	schemas := []string{db.Schema}
	for i := 1; i < 3; i++ {
		s := fmt.Sprintf("%s_%d", db.Schema, i)
		_, err := outbox.Migrate(ctx, db.Pool, &outbox.MigrateConfig{Schema: s, Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA "`+s+`" CASCADE`) })
	}
	client, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	require.NoError(t, err)
	defer client.Close()
	relays := make([]*Relay, len(schemas))
	for i, s := range schemas {
		relays[i], err = NewRelay(db.Pool, client, &RelayConfig{Schema: s, Logger: quiet, RelayID: "model"})
		require.NoError(t, err)
	}
	var aggs int

	rapid.Check(t, func(rt *rapid.T) {
		sess := newLockSession(relays[0].cfg.SessionConfig, relays[0].checkSession, "", true)
		owners := make([]*bucketOwner, len(relays))
		for i, r := range relays {
			owners[i] = newBucketOwner(r, sess)
		}
		// stale[i]: owner i owned buckets in a session that died since.
		stale := make([]bool, len(owners))
		left := make([]bool, len(owners))
		defer func() {
			for i, o := range owners {
				if !left[i] {
					o.close()
				}
			}
			sess.close()
		}()

		locked := func(i int) []int32 {
			conn, _ := sess.live()
			if conn == nil {
				return nil
			}
			rows, err := db.Pool.Query(ctx, `SELECT objid::int FROM pg_locks
				WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = $1::bigint AND pid = $2 ORDER BY 1`,
				int64(uint32(relays[i].lockKey)), conn.PgConn().PID())
			require.NoError(rt, err)
			var out []int32
			for rows.Next() {
				var b int32
				require.NoError(rt, rows.Scan(&b))
				out = append(out, b)
			}
			require.NoError(rt, rows.Err())
			return out
		}
		check := func() {
			if conn, _ := sess.live(); conn != nil {
				var alive bool
				require.NoError(rt, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, conn.PgConn().PID()).Scan(&alive))
				if !alive {
					return // killed, and no owner has noticed yet
				}
			}
			for i, o := range owners {
				held := locked(i)
				if left[i] {
					require.Empty(rt, held, "owner %d left but its locks stay", i)
					continue
				}
				if _, gen := sess.live(); gen != o.gen {
					continue // it forgets in its next turn, before claiming
				}
				for _, b := range o.claimable {
					require.True(rt, slices.Contains(held, b), "owner %d counts bucket %d claimable, unlocked (held %v)", i, b, held)
				}
			}
		}

		rt.Repeat(map[string]func(*rapid.T){
			"rebalance": func(rt *rapid.T) {
				i := rapid.IntRange(0, len(owners)-1).Draw(rt, "owner")
				if left[i] {
					return
				}
				if err := owners[i].rebalance(ctx, false); err != nil {
					// The first use of a killed session fails; the next
					// connects again.
					require.NoError(rt, owners[i].rebalance(ctx, false), "after %v", err)
				}
				require.Len(rt, owners[i].owned, numBuckets)
				stale[i] = false
				check()
			},
			"claim": func(rt *rapid.T) {
				i := rapid.IntRange(0, len(owners)-1).Draw(rt, "owner")
				if left[i] {
					return
				}
				aggs++
				tx, err := db.Pool.Begin(ctx)
				require.NoError(rt, err)
				_, err = NewWriter(&WriterConfig{Schema: schemas[i]}).Write(ctx, tx,
					Event{AggregateType: "model", AggregateID: fmt.Sprint(aggs), EventType: "e", Payload: []byte("x")})
				require.NoError(rt, err)
				require.NoError(rt, tx.Commit(ctx))
				o := owners[i]
				had := len(o.claimable) > 0
				batch, err := o.claim(ctx, nil)
				switch {
				case stale[i]:
					require.Empty(rt, batch, "owner %d claimed with buckets of a dead session", i)
					require.Empty(rt, o.owned, "owner %d kept buckets of a dead session", i)
				case err == nil && had && len(o.claimable) == numBuckets:
					require.NotEmpty(rt, batch, "owner %d owns every bucket and found nothing", i)
				}
				if err != nil || len(o.owned) == 0 {
					stale[i] = false
				}
				check()
			},
			"kill the session": func(rt *rapid.T) {
				conn, _ := sess.live()
				if conn == nil {
					return
				}
				pid := conn.PgConn().PID()
				_, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
				require.NoError(rt, err)
				eventually.True(t, 10*time.Second, func() bool {
					var gone bool
					require.NoError(rt, db.Pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&gone))
					return gone
				}, "the session ended")
				for i, o := range owners {
					stale[i] = stale[i] || len(o.owned) > 0
				}
			},
			"leave or join": func(rt *rapid.T) {
				i := rapid.IntRange(0, len(owners)-1).Draw(rt, "owner")
				if left[i] {
					owners[i] = newBucketOwner(relays[i], sess)
					left[i], stale[i] = false, false
				} else {
					owners[i].close()
					left[i] = true
				}
				check()
			},
		})
	})
}
