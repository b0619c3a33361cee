package producer

import (
	"cmp"
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// numBuckets is how many hash buckets the aggregates are spread over. It is
// fixed, not configuration: every instance must agree on it, and 64 allows
// up to 64 instances per database.
const numBuckets = 64

// hashExprE is an event row's aggregate hash, in a query that calls the
// events table e: the value an aggregate's bucket derives from, and the
// value the claim compares to leave the aggregates in flight out. It is
// computed where rows are claimed rather than stored with every write.
// bucketExpr maps the hash to its bucket (0 to numBuckets-1); it must agree
// everywhere, and bucketExprE is the same for the table called e.
const (
	hashExprE   = `hashtext(e.aggregate_type || ':' || e.aggregate_id)`
	bucketExpr  = `((hashtext(aggregate_type || ':' || aggregate_id) % 64) + 64) % 64`
	bucketExprE = `((` + hashExprE + ` % 64) + 64) % 64`
)

func schemaLockKey(schema string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte("outbox.relay:" + schema))
	return int32(h.Sum32())
}

// bucketOwner holds this instance's share of the buckets. Its session
// connection holds one advisory lock per owned bucket and also runs the
// claims: if the session dies, the locks die with it and so does the next
// claim, so a relay that lost its locks cannot go on claiming their work.
// Only the goroutine running Relay.Run touches it.
type bucketOwner struct {
	r    *Relay
	conn *pgx.Conn
	// owned are the buckets this session has locked.
	owned map[int32]bool
	// fencedUntil holds newly taken buckets whose previous owner may still be
	// publishing claimed rows; they are not claimed from before then.
	fencedUntil map[int32]time.Time
	// claimable is owned minus fenced, sorted; the claim's parameter.
	claimable []int32
	// idleRefreshed is when idle_until was last extended.
	idleRefreshed time.Time
}

func newBucketOwner(r *Relay) *bucketOwner {
	return &bucketOwner{r: r, owned: map[int32]bool{}, fencedUntil: map[int32]time.Time{}}
}

// rebalance renews this instance's heartbeat and takes or gives up buckets
// so that each live instance owns about numBuckets/live of them. It runs
// between batches, so a bucket given up has nothing of ours in flight.
func (o *bucketOwner) rebalance(ctx context.Context, idle bool) error {
	if o.conn == nil || o.conn.IsClosed() {
		o.dropAll(ctx)
		conn, err := pgx.ConnectConfig(ctx, o.r.cfg.SessionConfig)
		if err != nil {
			return err
		}
		o.conn = conn
	}
	s := &o.r.sql
	stale := 3 * o.r.cfg.RebalanceInterval
	var live int
	err := o.conn.QueryRow(ctx, s.heartbeat, o.r.cfg.RelayID, idle, o.idleFor().Milliseconds(), stale.Milliseconds()).Scan(&live)
	if err != nil {
		o.reset(ctx)
		return err
	}
	if idle {
		o.idleRefreshed = time.Now()
	}
	target := (numBuckets + live - 1) / max(live, 1)

	if extra := len(o.owned) - target; extra > 0 {
		var give []int32
		for _, b := range o.sortedOwned() {
			if len(give) == extra {
				break
			}
			give = append(give, b)
		}
		if _, err := o.conn.Exec(ctx, `SELECT pg_advisory_unlock($1, b) FROM unnest($2::int[]) AS b`, o.r.lockKey, give); err != nil {
			o.dropAll(ctx) // which locks are still held is unknown: end the session
			return err
		}
		for _, b := range give {
			delete(o.owned, b)
			delete(o.fencedUntil, b)
		}
		o.r.log.InfoContext(ctx, "relay: gave up buckets", slog.Int("count", len(give)), slog.Int("owned", len(o.owned)), slog.Int("live_relays", live))
	}
	if want := target - len(o.owned); want > 0 {
		// Start at a place derived from the relay id so that instances
		// starting together try different buckets first.
		start := int32(schemaLockKey(o.r.cfg.RelayID)&0x7fffffff) % numBuckets
		var free []int32
		for i := range int32(numBuckets) {
			if b := (start + i) % numBuckets; !o.owned[b] {
				free = append(free, b)
			}
		}
		// Without ORDER BY the function scan yields the array in order and
		// the LIMIT stops it, so no more locks are taken than wanted.
		rows, err := o.conn.Query(ctx, `SELECT b FROM unnest($2::int[]) AS b WHERE pg_try_advisory_lock($1, b) LIMIT $3`, o.r.lockKey, free, want)
		var taken []int32
		if err == nil {
			taken, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		}
		if err != nil {
			// Some locks may have been taken without our knowing which: end
			// the session so that none is held unaccounted for.
			o.dropAll(ctx)
			return err
		}
		if len(taken) > 0 {
			for _, b := range taken {
				o.owned[b] = true
				o.fencedUntil[b] = time.Now() // checked below
			}
			o.r.log.InfoContext(ctx, "relay: took buckets", slog.Int("count", len(taken)), slog.Int("owned", len(o.owned)), slog.Int("live_relays", live))
		}
	}
	return o.refreshFences(ctx)
}

// refreshFences looks, for each fenced bucket, whether rows in it are still
// leased to somebody (a previous owner that lost its lock while publishing),
// and keeps the bucket out of claims until those leases end or the rows are
// marked. This keeps two instances from publishing one aggregate at once.
func (o *bucketOwner) refreshFences(ctx context.Context) error {
	if len(o.fencedUntil) > 0 {
		var check []int32
		for b, until := range o.fencedUntil {
			if !time.Now().Before(until) {
				check = append(check, b)
			}
		}
		if len(check) > 0 {
			rows, err := o.conn.Query(ctx, o.r.sql.leasedBuckets, check)
			if err != nil {
				o.reset(ctx)
				return err
			}
			busy := map[int32]time.Time{}
			for rows.Next() {
				var b int32
				var seconds float64
				if err := rows.Scan(&b, &seconds); err != nil {
					rows.Close()
					return err
				}
				busy[b] = time.Now().Add(time.Duration(seconds * float64(time.Second)))
			}
			if err := rows.Err(); err != nil {
				o.reset(ctx)
				return err
			}
			for _, b := range check {
				if until, ok := busy[b]; ok {
					o.fencedUntil[b] = until
				} else {
					delete(o.fencedUntil, b)
				}
			}
		}
	}
	o.claimable = o.claimable[:0]
	for _, b := range o.sortedOwned() {
		if _, fenced := o.fencedUntil[b]; !fenced {
			o.claimable = append(o.claimable, b)
		}
	}
	return nil
}

// fenceAll keeps every owned bucket out of claims until the given time.
// The bound is local time, Lease from now: the lease it waits out was set
// by the server before now, so it ends before that.
func (o *bucketOwner) fenceAll(until time.Time) {
	for b := range o.owned {
		o.fencedUntil[b] = until
	}
	o.claimable = o.claimable[:0]
}

func (o *bucketOwner) sortedOwned() []int32 {
	out := make([]int32, 0, len(o.owned))
	for b := range o.owned {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}

// claim leases the next batch of this instance's buckets, leaving out the
// aggregates whose bucket hash is in busy. It runs on the lock session: a
// claim succeeds only while the locks are held.
func (o *bucketOwner) claim(ctx context.Context, busy []int32) ([]*claimedEvent, error) {
	if o.conn == nil {
		return nil, errNoSession
	}
	if len(o.claimable) == 0 {
		return nil, nil
	}
	rows, err := o.conn.Query(ctx, o.r.sql.claim, o.claimable, o.r.cfg.BatchSize, o.r.cfg.Lease.Milliseconds(), busy)
	if err != nil {
		o.reset(ctx)
		return nil, err
	}
	batch, err := pgx.CollectRows(rows, scanClaimed)
	if err != nil {
		o.reset(ctx)
		return nil, err
	}
	slices.SortFunc(batch, func(a, b *claimedEvent) int { return cmp.Compare(a.id, b.id) })
	return batch, nil
}

var errNoSession = errors.New("relay: no session connection to claim with; reconnecting")

// setIdle records whether this instance is idle, which decides whether
// writers' commits notify.
func (o *bucketOwner) setIdle(ctx context.Context, idle bool) error {
	var until any
	if idle {
		until = o.idleFor().Milliseconds()
		o.idleRefreshed = time.Now()
	}
	_, err := o.r.pool.Exec(ctx, o.r.sql.setIdle, o.r.cfg.RelayID, until)
	return err
}

// refreshIdle extends idle_until before it lapses.
func (o *bucketOwner) refreshIdle(ctx context.Context) error {
	if time.Since(o.idleRefreshed) < o.r.cfg.PollInterval {
		return nil
	}
	return o.setIdle(ctx, true)
}

// idleFor is how long an idle flag stays valid without a refresh: long
// enough to survive a slow poll, short enough that a relay that died idle
// stops costing writers a NOTIFY soon.
func (o *bucketOwner) idleFor() time.Duration {
	return 3 * max(o.r.cfg.PollInterval, o.r.cfg.RebalanceInterval)
}

// reset drops the session after a claim error if the session is gone.
func (o *bucketOwner) reset(ctx context.Context) {
	if o.conn != nil && o.conn.IsClosed() {
		o.dropAll(ctx)
	}
}

// dropAll forgets every bucket: the session that held their locks is gone,
// and the server released them with it.
func (o *bucketOwner) dropAll(ctx context.Context) {
	if len(o.owned) > 0 && ctx.Err() == nil {
		o.r.log.Warn("relay: lost the session holding its bucket locks; stopped publishing until it reconnects", slog.Int("buckets", len(o.owned)))
	}
	if o.conn != nil {
		_ = o.conn.Close(context.Background())
		o.conn = nil
	}
	clear(o.owned)
	clear(o.fencedUntil)
	o.claimable = o.claimable[:0]
}

// close leaves the group: it deletes this instance's row, so the others
// rebalance at their next tick, and ends the session, releasing the locks.
func (o *bucketOwner) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := o.r.pool.Exec(ctx, o.r.sql.leave, o.r.cfg.RelayID); err != nil {
		o.r.log.Warn("relay: remove heartbeat row; others notice after three rebalance intervals", slog.String("error", err.Error()))
	}
	if o.conn != nil {
		_ = o.conn.Close(ctx)
		o.conn = nil
	}
}
