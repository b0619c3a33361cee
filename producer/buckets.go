package producer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
)

// numBuckets is how many hash buckets the aggregates are spread over; see
// tables.RelayBuckets, whose statements compute a row's bucket.
const numBuckets = tables.RelayBuckets

func schemaLockKey(schema string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte("outbox.relay:" + schema))
	return int32(h.Sum32()) //nolint:gosec // the hash's bits as an advisory lock key; wrapping is the point
}

// bucketOwner holds this instance's share of the buckets. Its session
// connection holds one advisory lock per owned bucket and also runs the
// claims: if the session dies, the locks die with it and so does the next
// claim, so a relay that lost its locks cannot go on claiming their work.
// In a Fleet the session is shared by the shards of one server: every
// owner checks, in its turn, that the session is the one its buckets were
// locked in (gen) and forgets them if not, before it claims anything.
// Only the goroutine running [Relay.Run] touches it.
type bucketOwner struct {
	r    *Relay
	sess *lockSession
	// conn is the session's connection while this owner holds the
	// session's turn; nil otherwise.
	conn *pgx.Conn
	// gen is the session generation the owned buckets were locked in.
	gen uint64
	// lost is set when the owner forgot buckets whose session ended, so
	// that Run's loop rebalances at once rather than when due.
	lost bool
	// owned are the buckets this session has locked.
	owned map[int32]bool
	// unchecked are newly taken buckets whose leased rows have not been
	// looked up yet; nothing is claimed from them until they are.
	unchecked map[int32]bool
	// holds are the aggregates, by bucket hash, that claims leave out
	// because rows of theirs are leased: to a previous owner of their
	// bucket, which may still be publishing them, or by a batch of this
	// relay whose outcome could not be recorded. Claiming their later rows
	// would put them on the wire first; claiming the leased rows themselves
	// is not possible before the lease ends. A hold ends when its lease
	// does, and is then looked up again: a lease renewed meanwhile (its
	// relay is still waiting for the broker) holds on.
	holds map[int32]hold
	// claimable is owned minus unchecked, sorted; the claim's parameter.
	claimable []int32
	// idleRefreshed is when idle_until was last extended.
	idleRefreshed time.Time
	// live is how many live instances the last heartbeat counted.
	live int
	// sessionPID is the server pid the lock session's first heartbeat ran
	// in; every later one must run there too.
	sessionPID uint32
	// noBucketsSince is when the instance was last seen owning no bucket
	// after owning some or starting; zero while it owns buckets.
	// noBucketsWarned is when warnIfNoBuckets last said so.
	noBucketsSince, noBucketsWarned time.Time
}

// hold is one aggregate left out of claims until its lease ends.
type hold struct {
	bucket                     int32
	aggregateType, aggregateID string
	until                      time.Time
	// own is set for the aggregates of a batch of this relay whose outcome
	// could not be recorded.
	own bool
}

func newBucketOwner(r *Relay, sess *lockSession) *bucketOwner {
	return &bucketOwner{r: r, sess: sess, owned: map[int32]bool{}, unchecked: map[int32]bool{}, holds: map[int32]hold{}}
}

// bucketOf is the bucket of a hash computed by the server, as the
// relay's statements compute it (tables.RelayBuckets).
func bucketOf(hash int32) int32 { return ((hash % numBuckets) + numBuckets) % numBuckets }

// rebalance renews this instance's heartbeat and takes or gives up buckets
// so that each live instance owns about numBuckets/live of them. It runs
// between batches, so a bucket given up has nothing of ours in flight.
func (o *bucketOwner) rebalance(ctx context.Context, idle bool) error {
	if err := o.rebalanceInTurn(ctx, idle); err != nil {
		return err
	}
	// Nothing is in flight between batches.
	return o.refreshHoldsNow(ctx, nil)
}

// rebalanceInTurn is rebalance but for the look-up of the buckets taken,
// in a turn on the session.
func (o *bucketOwner) rebalanceInTurn(ctx context.Context, idle bool) error {
	o.lost = false
	if err := o.take(ctx, true); err != nil {
		return err
	}
	defer o.give()
	o.lost = false // take may have forgotten buckets: the rebalance is now
	s := &o.r.sql
	stale := 3 * o.r.cfg.RebalanceInterval
	var (
		live int
		pid  uint32
	)
	err := o.conn.QueryRow(ctx, s.Heartbeat, o.r.cfg.RelayID, idle, o.idleFor().Milliseconds(), stale.Milliseconds()).Scan(&live, &pid)
	if err != nil {
		o.reset(ctx)
		return err
	}
	if o.sessionPID == 0 {
		o.sessionPID = pid
	} else if pid != o.sessionPID {
		// The check at connect passed, but a transaction pooler can hand
		// the same server session back for a while: this proves it did
		// not keep doing so.
		o.dropAll(ctx)
		return o.r.notSession(o.r.cfg.SessionConfig, fmt.Errorf("%w: its heartbeats ran in server sessions %d and then %d", outbox.ErrNotSession, o.sessionPID, pid))
	}
	o.live = live
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
		if _, err := o.conn.Exec(ctx, o.r.sql.UnlockBuckets, o.r.lockKey, give); err != nil {
			o.dropAll(ctx) // which locks are still held is unknown: end the session
			return err
		}
		for _, b := range give {
			delete(o.owned, b)
			delete(o.unchecked, b)
		}
		for h, hd := range o.holds {
			if !o.owned[hd.bucket] {
				delete(o.holds, h)
			}
		}
		o.r.log.InfoContext(ctx, "relay: gave up buckets", slog.Int("count", len(give)), slog.Int("owned", len(o.owned)), slog.Int("live_relays", live))
	}
	if want := target - len(o.owned); want > 0 {
		// Start at a place derived from the relay id so that instances
		// starting together try different buckets first.
		start := (schemaLockKey(o.r.cfg.RelayID) & 0x7fffffff) % numBuckets
		var free []int32
		for i := range int32(numBuckets) {
			if b := (start + i) % numBuckets; !o.owned[b] {
				free = append(free, b)
			}
		}
		// At most want of them (see tables.Relay.LockBuckets).
		rows, err := o.conn.Query(ctx, o.r.sql.LockBuckets, o.r.lockKey, free, want)
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
				o.unchecked[b] = true // looked up below
			}
			o.r.log.InfoContext(ctx, "relay: took buckets", slog.Int("count", len(taken)), slog.Int("owned", len(o.owned)), slog.Int("live_relays", live))
		}
	}
	return nil
}

// take waits for the session's turn and, with connect, connects it if it
// is down. An owner whose buckets were locked in an earlier connection, or
// in one that is down, forgets them here, before it can claim: their locks
// ended with it. It
// returns errNoSession when there is no connection (without connect), and
// then, as on any error, the caller must not call give.
func (o *bucketOwner) take(ctx context.Context, connect bool) error {
	if err := o.sess.acquire(ctx); err != nil {
		return err
	}
	var (
		conn *pgx.Conn
		gen  uint64
		err  error
	)
	if connect {
		conn, gen, err = o.sess.connect(ctx)
	} else {
		conn, gen = o.sess.live()
	}
	if gen != o.gen || conn == nil {
		o.dropAll(ctx)
		o.gen, o.sessionPID = gen, 0
	}
	if err == nil && conn == nil {
		err = errNoSession
	}
	if err != nil {
		o.sess.release()
		return err
	}
	o.conn = conn
	return nil
}

// give ends the owner's turn on the session.
func (o *bucketOwner) give() {
	o.conn = nil
	o.sess.release()
}

// refreshHoldsNow is refreshHolds in a turn of its own on a Relay's
// session. A Fleet's shard looks up on its pool, outside the turn: the
// look-up reads the backlog of the buckets, and over a large one would
// hold up every other shard of the server.
func (o *bucketOwner) refreshHoldsNow(ctx context.Context, busy []int32) error {
	if o.sess.shared {
		return o.refreshHolds(ctx, busy)
	}
	if err := o.take(ctx, false); err != nil {
		return err
	}
	defer o.give()
	return o.refreshHolds(ctx, busy)
}

// holdsDue reports whether a hold has ended or a bucket waits to be
// checked, so that refreshHolds has something to do.
func (o *bucketOwner) holdsDue() bool {
	if len(o.unchecked) > 0 {
		return true
	}
	now := time.Now()
	for _, h := range o.holds {
		if !now.Before(h.until) {
			return true
		}
	}
	return false
}

// nextHoldEnd is when the first hold ends; zero when there is none.
func (o *bucketOwner) nextHoldEnd() time.Time {
	var next time.Time
	for _, h := range o.holds {
		if next.IsZero() || h.until.Before(next) {
			next = h.until
		}
	}
	return next
}

// refreshHolds looks up the leased rows of the buckets just taken and of
// the buckets whose holds ended, leaving out the aggregates of the batch in
// flight (busy, their hashes), and holds each aggregate found until its
// last lease ends. This keeps two instances from publishing one aggregate
// at once, and a new owner from publishing an aggregate's later events
// before the leased ones. Only the aggregates with leased rows wait; the
// rest of a bucket is claimed from at once. On an error, buckets not looked
// up stay out of claims and ended holds stay in force. A Relay's caller
// holds the session's turn; a Fleet's shard looks up on its pool
// (refreshHoldsNow).
func (o *bucketOwner) refreshHolds(ctx context.Context, busy []int32) error {
	defer o.publishHealth()
	var check []int32
	seen := map[int32]bool{}
	for b := range o.unchecked {
		check, seen[b] = append(check, b), true
	}
	now := time.Now()
	for _, h := range o.holds {
		if !now.Before(h.until) && !seen[h.bucket] {
			check, seen[h.bucket] = append(check, h.bucket), true
		}
	}
	if len(check) > 0 {
		if busy == nil {
			busy = []int32{}
		}
		var db interface {
			Query(context.Context, string, ...any) (pgx.Rows, error)
		} = o.r.pool
		if !o.sess.shared {
			db = o.conn
		}
		rows, err := db.Query(ctx, o.r.sql.LeasedAggregates, check, busy)
		if err != nil {
			o.reset(ctx)
			o.updateClaimable()
			return err
		}
		found := map[int32]hold{}
		for rows.Next() {
			var h hold
			var hash int32
			var seconds float64
			if err := rows.Scan(&h.bucket, &hash, &h.aggregateType, &h.aggregateID, &seconds); err != nil {
				rows.Close()
				o.updateClaimable()
				return err
			}
			h.until = now.Add(time.Duration(seconds * float64(time.Second)))
			if prev, ok := found[hash]; ok && prev.until.After(h.until) {
				h.until = prev.until // a hash shared by two aggregates holds both
			}
			found[hash] = h
		}
		if err := rows.Err(); err != nil {
			o.reset(ctx)
			o.updateClaimable()
			return err
		}
		had := len(o.holds)
		for hash, h := range o.holds {
			if seen[h.bucket] {
				if _, still := found[hash]; still {
					found[hash] = hold{bucket: h.bucket, aggregateType: found[hash].aggregateType, aggregateID: found[hash].aggregateID,
						until: found[hash].until, own: h.own}
				}
				delete(o.holds, hash)
			}
		}
		for hash, h := range found {
			o.holds[hash] = h
		}
		for _, b := range check {
			delete(o.unchecked, b)
		}
		switch {
		case len(found) > 0:
			o.logHolds(ctx, "relay: holding back aggregates whose events are still leased (to a relay that lost their buckets, or to a batch of this one whose outcome was not recorded); they resume when the leases end", found)
		case had > 0 && len(o.holds) == 0:
			o.r.log.InfoContext(ctx, "relay: leases ended; the held aggregates are published again", slog.Int("aggregates", had))
		}
	}
	o.updateClaimable()
	return nil
}

// holdBatch holds the aggregates of a batch whose outcome could not be
// recorded until its lease ends: its rows keep their lease and nothing
// says which failed, so their aggregates' later events must not go out
// before them. Then they come first, in order, and the acknowledged ones go
// out a second time, which at-least-once allows.
func (o *bucketOwner) holdBatch(ctx context.Context, batch []*claimedEvent, until time.Time) {
	defer o.publishHealth()
	added := map[int32]hold{}
	for _, e := range batch {
		h := hold{bucket: bucketOf(e.bucketHash), aggregateType: e.aggregateType, aggregateID: e.aggregateID, until: until, own: true}
		if prev, ok := o.holds[e.bucketHash]; ok && prev.until.After(until) {
			h.until = prev.until
		}
		o.holds[e.bucketHash], added[e.bucketHash] = h, h
	}
	o.logHolds(ctx, "relay: holding back the aggregates of a batch whose outcome could not be recorded until its lease ends; their events are published again then", added)
}

// logHolds says at WARN which aggregates are held, in which buckets and
// until when.
func (o *bucketOwner) logHolds(ctx context.Context, msg string, held map[int32]hold) {
	var until time.Time
	var buckets []int32
	var sample []string
	inBucket := map[int32]bool{}
	for _, h := range held {
		if h.until.After(until) {
			until = h.until
		}
		if !inBucket[h.bucket] {
			inBucket[h.bucket] = true
			buckets = append(buckets, h.bucket)
		}
		sample = append(sample, h.aggregateType+"/"+h.aggregateID)
	}
	slices.Sort(buckets)
	slices.Sort(sample)
	o.r.log.WarnContext(ctx, msg, slog.Int("aggregates", len(held)), slog.Any("buckets", buckets),
		slog.Any("sample", sample[:min(len(sample), 10)]), slog.Time("until", until),
		slog.Duration("for", time.Until(until).Round(time.Millisecond)))
}

// updateClaimable recomputes claimable from owned and unchecked.
func (o *bucketOwner) updateClaimable() {
	o.claimable = o.claimable[:0]
	for _, b := range o.sortedOwned() {
		if !o.unchecked[b] {
			o.claimable = append(o.claimable, b)
		}
	}
}

// heldHashes returns the bucket hashes of the held aggregates.
func (o *bucketOwner) heldHashes() []int32 {
	out := make([]int32, 0, len(o.holds))
	for h := range o.holds {
		out = append(out, h)
	}
	return out
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
// aggregates whose bucket hash is in busy and the held ones. A Relay's
// claim runs on its lock session: a claim succeeds only while the locks
// are held. A Fleet's shards claim beside it (claimBeside).
func (o *bucketOwner) claim(ctx context.Context, busy []int32) ([]*claimedEvent, error) {
	if len(o.claimable) == 0 {
		return nil, nil
	}
	if o.sess.shared {
		return o.claimBeside(ctx, busy)
	}
	if err := o.take(ctx, false); err != nil {
		return nil, err
	}
	defer o.give()
	if len(o.claimable) == 0 {
		return nil, nil
	}
	var batch []*claimedEvent
	if err := o.conn.SendBatch(ctx, o.claimPipeline(o.r.sql.ClaimNoFlush, busy, &batch)).Close(); err != nil {
		o.reset(ctx)
		return nil, err
	}
	slices.SortFunc(batch, func(a, b *claimedEvent) int { return cmp.Compare(a.id, b.id) })
	return batch, nil
}

// claimPipeline is a claim in one round trip and one implicit transaction
// (a pipeline with one Sync): setup, which sets the transaction's settings
// (tables.Relay.ClaimNoFlush on a lock session, ClaimPooled on a pool:
// the claim commits without waiting for the WAL flush; ClaimNoFlush says
// why that is safe), then Claim, leaving out busy and the held
// aggregates, whose rows land in batch.
func (o *bucketOwner) claimPipeline(setup string, busy []int32, batch *[]*claimedEvent) *pgx.Batch {
	if len(o.holds) > 0 {
		busy = append(slices.Clip(busy), o.heldHashes()...)
	}
	b := &pgx.Batch{}
	b.Queue(setup)
	b.Queue(o.r.sql.Claim, o.claimable, o.r.cfg.BatchSize, o.r.cfg.Lease.Milliseconds(), busy).Query(func(rows pgx.Rows) error {
		var err error
		*batch, err = pgx.CollectRows(rows, scanClaimed)
		return err
	})
	return b
}

// claimBeside is the claim of a Fleet's shard. The shards of a server
// share one lock session; claiming on it, they would take turns, and a
// quiet shard's claim would wait for a backlogged shard's claim of up to
// BatchSize rows each time. So the claim runs on a connection of the
// server's pool, at the same time as the other shards' claims, and the
// lock session is used only around it, for a turn each as short as a
// round trip:
//   - before, without a round trip, to forget the buckets of a session
//     that was replaced (take);
//   - after a claim that found rows, to see that the session still runs
//     and is the one the buckets were locked in. If not, the rows are given
//     back unattempted and the claim fails with errNoSession, as a claim on
//     the dead session would have.
//
// Between the two a session can die and another relay take its buckets
// and claim in them too. That is the case the claim statement is written
// for, a relay still publishing after its lease lapsed: a leased or locked
// row holds back its aggregate's later rows, so the two never put an
// aggregate's events on the wire out of order.
func (o *bucketOwner) claimBeside(ctx context.Context, busy []int32) ([]*claimedEvent, error) {
	if err := o.take(ctx, false); err != nil {
		return nil, err
	}
	gen := o.gen
	o.give()
	if len(o.claimable) == 0 {
		return nil, nil
	}
	var batch []*claimedEvent
	if err := o.r.pool.SendBatch(ctx, o.claimPipeline(o.r.sql.ClaimPooled, busy, &batch)).Close(); err != nil {
		return nil, err
	}
	if len(batch) == 0 {
		return nil, nil
	}
	if err := o.stillLocked(ctx, gen); err != nil {
		o.giveBack(ctx, batch)
		return nil, err
	}
	slices.SortFunc(batch, func(a, b *claimedEvent) int { return cmp.Compare(a.id, b.id) })
	return batch, nil
}

// stillLocked checks, in a turn on the lock session, that the session
// that locked the owner's buckets in generation gen still runs. If it does
// not, the owner forgets its buckets and the error is errNoSession.
func (o *bucketOwner) stillLocked(ctx context.Context, gen uint64) error {
	if err := o.take(ctx, false); err != nil {
		return err
	}
	defer o.give()
	if o.gen != gen {
		return errNoSession
	}
	if err := o.conn.Ping(ctx); err != nil {
		o.reset(ctx)
		if len(o.owned) == 0 {
			return errNoSession
		}
		return err
	}
	return nil
}

// giveBack releases a claimed batch unattempted. If that fails too, its
// rows wait out their lease.
func (o *bucketOwner) giveBack(ctx context.Context, batch []*claimedEvent) {
	ids := make([]int64, len(batch))
	for i, e := range batch {
		ids[i] = e.id
	}
	if _, err := o.r.pool.Exec(ctx, o.r.sql.Release, ids, batch[0].leasedUntil); err != nil {
		o.r.logError(ctx, "relay: give back a batch claimed as the lock session died; it waits out its lease", err)
	}
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
	_, err := o.r.pool.Exec(ctx, o.r.sql.SetIdle, o.r.cfg.RelayID, until)
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

// reset drops the session after an error if the session is gone. The
// caller holds the session's turn.
func (o *bucketOwner) reset(ctx context.Context) {
	if o.conn != nil && o.conn.IsClosed() {
		o.dropAll(ctx)
	}
}

// dropAll forgets every bucket: the session that held their locks is gone,
// and the server released them with it. When the session still runs (its
// owner cannot tell which locks it holds) dropAll ends it, and with it the
// locks of every shard sharing it, which forget theirs in their next turn.
// The caller holds the session's turn.
func (o *bucketOwner) dropAll(ctx context.Context) {
	if len(o.owned) > 0 {
		o.lost = true
		if ctx.Err() == nil {
			o.r.log.Warn("relay: lost the session holding its bucket locks; stopped publishing until it reconnects", slog.Int("buckets", len(o.owned)))
		}
	}
	if o.conn != nil {
		o.sess.close()
		o.conn = nil
	}
	clear(o.owned)
	clear(o.unchecked)
	clear(o.holds)
	o.claimable = o.claimable[:0]
	o.publishHealth()
}

// close leaves the group: it deletes this instance's row, so the others
// rebalance at their next tick, and releases the locks: a Relay ends its
// session, a Fleet's shard unlocks its own buckets on the shared one.
func (o *bucketOwner) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := o.r.pool.Exec(ctx, o.r.sql.Leave, o.r.cfg.RelayID); err != nil {
		o.r.log.Warn("relay: remove heartbeat row; others notice after three rebalance intervals", slog.String("error", err.Error()))
	}
	if err := o.sess.acquire(ctx); err != nil {
		o.r.log.Warn("relay: release bucket locks: the shared session stayed busy; they are released when it ends", slog.String("error", err.Error()))
		return
	}
	defer o.sess.release()
	if !o.sess.shared {
		o.sess.close()
		return
	}
	conn, gen := o.sess.live()
	if conn == nil || gen != o.gen || len(o.owned) == 0 {
		return
	}
	if _, err := conn.Exec(ctx, o.r.sql.UnlockBuckets, o.r.lockKey, o.sortedOwned()); err != nil {
		// Which locks are still held is unknown: end the session, which the
		// other shards notice in their next turn.
		o.r.log.Warn("relay: release bucket locks on the shared session; ending it", slog.String("error", err.Error()))
		o.sess.close()
	}
	clear(o.owned)
}

// noBucketsWarnAfter is how long an instance may own no bucket while
// events wait before it says so at WARN (or five RebalanceIntervals, if
// shorter), and how often it says so again while that lasts.
const noBucketsWarnAfter = 30 * time.Second

// warnIfNoBuckets says at WARN when the instance has owned no bucket for
// noBucketsWarnAfter while undelivered events wait. Owning none is normal
// for a moment while instances come and go, and for the instances beyond
// the 64th; for longer, the bucket locks are held by sessions that are not
// the live relays' own lock sessions, and no one may be publishing. It
// runs after each rebalance, on Run's goroutine.
func (o *bucketOwner) warnIfNoBuckets(ctx context.Context) {
	now := time.Now()
	if len(o.owned) > 0 || o.live > numBuckets {
		o.noBucketsSince = time.Time{}
		return
	}
	if o.noBucketsSince.IsZero() {
		o.noBucketsSince = now
	}
	after := min(noBucketsWarnAfter, 5*o.r.cfg.RebalanceInterval)
	if now.Sub(o.noBucketsSince) < after || now.Sub(o.noBucketsWarned) < noBucketsWarnAfter {
		return
	}
	var waiting bool
	if err := o.r.pool.QueryRow(ctx, o.r.sql.AnyUndelivered).Scan(&waiting); err != nil {
		o.r.logError(ctx, "relay: look for undelivered events while owning no bucket", err)
		return
	}
	if !waiting {
		return
	}
	o.noBucketsWarned = now
	o.r.log.WarnContext(ctx, "relay: owns no bucket while events wait to be published; their bucket locks are held by other sessions: "+
		"if no relay of this schema owns buckets (Relay.Health), the locks are held by a session that is no live relay's, such as one a relay took "+
		"through a transaction pooler (RelayConfig.SessionConfig must be a session of its own), which keeps them until the pooler closes it",
		slog.Duration("for", now.Sub(o.noBucketsSince).Round(time.Second)), slog.Int("live_relays", o.live))
}
