package integration

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/integration/history"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgserver"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

// shardWorld is the many-shards scenario's world: three PostgreSQL
// clusters with a producer shard each, two consumer targets on two of
// them, one topic, writers that follow their aggregates across moves,
// relay fleets over all three shards, and a routing consumer group.
type shardWorld struct {
	t      *testing.T
	broker *kafkatest.Broker
	topic  string
	shards []*shardSide
	// targets are the routing consumer's databases, by name.
	targets []*shardTarget
	rec     history.Recorder

	mu sync.Mutex
	// route is where the writers send each aggregate's next transaction:
	// its first shard, then the shard a MovedError named.
	route map[string]int
	// seqs holds each aggregate's committed sequence numbers and shards.
	seqs map[string][]shardSeq
	// committed are the committed events' writes.
	committed []history.Write
	// unknown are attempts whose commit failed, by shard; resolve looks
	// them up.
	unknown map[int][]history.Write
	// redirected counts writes refused with a MovedError, arriving counts
	// those refused because the aggregate was arriving (retried on the
	// same shard).
	redirected, arriving int
	writeErrors          int
}

// shardSeq is one committed event's sequence number and shard.
type shardSeq struct {
	seq   int64
	shard int
}

// shardSide is one producer shard: its own cluster, a migrated schema, a
// pool on it (also the test's admin connection to the cluster) and a
// writer.
type shardSide struct {
	db     *pgtest.DB
	shard  shard.Shard
	writer *producer.Writer
}

// endpoint is the shard as a side of a move.
func (s *shardSide) endpoint() move.Endpoint { return move.Endpoint{Shard: s.shard, DB: s.db.Pool} }

// shardTarget is one target of the routing consumer: a schema of its own
// on one of the clusters, with an effects table.
type shardTarget struct {
	name string
	db   *pgtest.DB
}

// newShardWorld starts three clusters, each with a shard schema, and puts
// the two targets' schemas on the first two of them.
func newShardWorld(t *testing.T, b *kafkatest.Broker, partitions int32) *shardWorld {
	t.Helper()
	w := &shardWorld{t: t, broker: b, topic: b.Topic(t, partitions), route: map[string]int{}, seqs: map[string][]shardSeq{}, unknown: map[int][]history.Write{}}
	for i := range 3 {
		srv := pgtest.Own(t, pgserver.Config{})
		db := pgtest.New(t, &pgtest.Opts{Server: srv})
		w.shards = append(w.shards, &shardSide{
			db:     db,
			shard:  shard.Shard{Name: fmt.Sprintf("shard-%d", i), Database: srv.URL, Schema: db.Schema},
			writer: producer.NewWriter(&producer.WriterConfig{Schema: db.Schema}),
		})
	}
	for i := range 2 {
		db := pgtest.New(t, &pgtest.Opts{Server: w.shards[i].db.Server})
		_, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+db.Table("effects")+` (
			n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			event_id text NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL, seq bigint NOT NULL)`)
		require.NoError(t, err)
		w.targets = append(w.targets, &shardTarget{name: fmt.Sprintf("target-%d", i), db: db})
	}
	return w
}

// owner is the routing consumer's Route.Owner: a hash of the aggregate id
// picks the target, whichever shard the aggregate lives on.
func (w *shardWorld) owner(_, id string) (string, error) {
	return w.targetOf(id).name, nil
}

func (w *shardWorld) targetOf(id string) *shardTarget {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return w.targets[h.Sum32()%uint32(len(w.targets))]
}

// aggregateName is the id of aggregate i; aggregate i starts on shard i%3.
func aggregateName(i int) string { return fmt.Sprintf("agg-%03d", i) }

// startWriters runs writers over aggregates until the returned stop is
// called. Each transaction writes 1 to 3 events of one aggregate on the
// shard the writers last learnt it lives on.
func (w *shardWorld) startWriters(rng *rand.Rand, writers, aggregates int, rollback float64, maxPause time.Duration) (stop func()) {
	for i := range aggregates {
		w.route[aggregateName(i)] = i % len(w.shards)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range writers {
		rng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		wg.Go(func() {
			for ctx.Err() == nil {
				if !w.attempt(aggregateName(rng.IntN(aggregates)), 1+rng.IntN(3), rng.Float64() < rollback) {
					pause(ctx, 50*time.Millisecond)
				}
				pause(ctx, time.Duration(rng.Int64N(int64(maxPause))))
			}
		})
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
	w.t.Cleanup(stop)
	return stop
}

// attempt writes n events of agg in one transaction on its shard and
// commits it (or rolls it back), following the aggregate when a Write
// says it moved: to the shard the error names, or, while it is arriving
// there, again on the same shard a moment later. It returns false when the
// database failed the attempt.
func (w *shardWorld) attempt(agg string, n int, rollback bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		w.mu.Lock()
		at := w.route[agg]
		w.mu.Unlock()
		done, ok := w.attemptOn(ctx, at, agg, n, rollback)
		if done {
			return ok
		}
		if ctx.Err() != nil {
			w.failed()
			return false
		}
	}
}

// attemptOn is one try of attempt on shard at; done is false when the
// aggregate was refused there and the attempt goes on.
func (w *shardWorld) attemptOn(ctx context.Context, at int, agg string, n int, rollback bool) (done, ok bool) {
	sh := w.shards[at]
	tx, err := sh.db.Pool.Begin(ctx)
	if err != nil {
		w.failed()
		return true, false
	}
	defer func() { _ = tx.Rollback(ctx) }()
	events := make([]producer.Event, n)
	for i := range events {
		events[i] = producer.Event{AggregateType: "account", AggregateID: agg, EventType: "scenario.step", Payload: []byte("p-" + agg), Topic: w.topic}
	}
	written, err := sh.writer.Write(ctx, tx, events...)
	if moved := (*producer.MovedError)(nil); errors.As(err, &moved) {
		_ = tx.Rollback(ctx)
		w.moved(agg, at, moved)
		if moved.Arriving {
			pause(ctx, 10*time.Millisecond) // neither shard takes it for a moment: retry here shortly
		}
		return false, false
	}
	if err != nil {
		w.failed()
		return true, false
	}
	a := history.Aggregate{Type: "account", ID: agg}
	if rollback {
		_ = tx.Rollback(ctx)
		for _, e := range written {
			w.rec.Write(history.Write{EventID: e.EventID, Aggregate: a, Seq: e.Seq})
		}
		return true, true
	}
	err = tx.Commit(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range written {
		h := history.Write{EventID: e.EventID, Aggregate: a, Seq: e.Seq, Committed: err == nil}
		if err != nil {
			w.unknown[at] = append(w.unknown[at], h)
			continue
		}
		w.rec.Write(h)
		w.committed = append(w.committed, h)
		w.seqs[agg] = append(w.seqs[agg], shardSeq{seq: e.Seq, shard: at})
	}
	if err != nil {
		w.writeErrors++
		return true, false
	}
	return true, true
}

// moved notes a refused write: a moved aggregate is routed to its new
// shard from now on.
func (w *shardWorld) moved(agg string, at int, e *producer.MovedError) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.redirected++
	if e.Arriving {
		w.arriving++
		return
	}
	to := slices.IndexFunc(w.shards, func(s *shardSide) bool { return s.shard.Name == e.To })
	if to < 0 {
		w.t.Errorf("a write of %s on %s says it moved to unknown shard %q", agg, w.shards[at].shard.Name, e.To)
		return
	}
	if w.route[agg] == at {
		w.route[agg] = to
	}
}

func (w *shardWorld) failed() {
	w.mu.Lock()
	w.writeErrors++
	w.mu.Unlock()
}

// resolve settles the attempts whose commit failed by looking their events
// up on their shard.
func (w *shardWorld) resolve() {
	w.t.Helper()
	w.mu.Lock()
	unknown := w.unknown
	w.unknown = map[int][]history.Write{}
	w.mu.Unlock()
	for at, writes := range unknown {
		ids := make([]string, len(writes))
		for i, h := range writes {
			ids[i] = h.EventID
		}
		sh := w.shards[at]
		rows, err := sh.db.Pool.Query(context.Background(), `SELECT event_id::text, aggregate_seq FROM `+sh.db.Table("events")+` WHERE event_id = ANY($1::uuid[])`, ids)
		require.NoError(w.t, err)
		found := map[string]bool{}
		for rows.Next() {
			var id string
			var seq int64
			require.NoError(w.t, rows.Scan(&id, &seq))
			found[id] = true
		}
		require.NoError(w.t, rows.Err())
		w.mu.Lock()
		for _, h := range writes {
			h.Committed = found[h.EventID]
			if h.Committed {
				w.committed = append(w.committed, h)
				w.seqs[h.Aggregate.ID] = append(w.seqs[h.Aggregate.ID], shardSeq{seq: h.Seq, shard: at})
			}
			w.rec.Write(h)
		}
		w.mu.Unlock()
		w.t.Logf("resolved %d events on %s whose commit failed: %d had committed", len(writes), sh.shard.Name, len(found))
	}
}

// terminateApp ends every session of application app on db's cluster and
// waits until the server has ended them; it returns how many.
func terminateApp(t *testing.T, db *pgtest.DB, app string) int {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid`, pids)
	require.NoError(t, err)
	waitUntil(t, 30*time.Second, "terminated sessions to end", func() bool {
		var left int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&left)
		return err == nil && left == 0
	})
	return len(pids)
}
