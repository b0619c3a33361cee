package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/mock/gomock"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/ordering"
)

// routeTarget is one target of a routing test: a schema of its own and a
// pool whose search_path is that schema, so that a handler writing to the
// unqualified table "effects" writes in the target whose transaction it
// was given, and nowhere else.
type routeTarget struct {
	name string
	db   *pgtest.DB
	pool *downDB
	e    *effects
}

// downDB is a target's database that can be taken down: while down, every
// call fails as a lost server would.
type downDB struct {
	*pgxpool.Pool
	down atomic.Bool
}

var errServerDown = errors.New("test: server down")

func (d *downDB) Begin(ctx context.Context) (pgx.Tx, error) {
	if d.down.Load() {
		return nil, errServerDown
	}
	return d.Pool.Begin(ctx)
}

func (d *downDB) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	if d.down.Load() {
		return nil, errServerDown
	}
	return d.Pool.Acquire(ctx)
}

func (d *downDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if d.down.Load() {
		return pgconn.CommandTag{}, errServerDown
	}
	return d.Pool.Exec(ctx, sql, args...)
}

func (d *downDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if d.down.Load() {
		return nil, errServerDown
	}
	return d.Pool.Query(ctx, sql, args...)
}

func (d *downDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if d.down.Load() {
		return errRow{}
	}
	return d.Pool.QueryRow(ctx, sql, args...)
}

type errRow struct{}

func (errRow) Scan(...any) error { return errServerDown }

// newRouteTargets makes the targets named names.
func newRouteTargets(t *testing.T, names ...string) []*routeTarget {
	t.Helper()
	var out []*routeTarget
	for _, name := range names {
		db := pgtest.New(t, nil)
		cfg, err := pgxpool.ParseConfig(db.Server.URL)
		require.NoError(t, err)
		cfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
		cfg.MaxConns = 10
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		out = append(out, &routeTarget{name: name, db: db, pool: &downDB{Pool: pool}, e: newEffects(t, db)})
	}
	return out
}

// byPrefix routes aggregate "a-…" to target "a", "b-…" to "b", "x-…" to
// the target "nowhere", which does not exist, and fails for "err-…".
func byPrefix(_, id string) (string, error) {
	if strings.HasPrefix(id, "err-") {
		return "", errors.New("no owner known")
	}
	name, _, _ := strings.Cut(id, "-")
	if name == "x" {
		return "nowhere", nil
	}
	return name, nil
}

// routeConfig returns a Config that routes with byPrefix to targets, the
// fallback being the first.
func routeConfig(batch int, targets []*routeTarget) *consumer.Config {
	cfg := fastConfig(targets[0].db, batch)
	cfg.Schema = ""
	cfg.Route = &consumer.Route{Owner: byPrefix}
	for _, t := range targets {
		cfg.Route.Targets = append(cfg.Route.Targets, consumer.Target{Name: t.name, DB: t.pool, Schema: t.db.Schema})
	}
	return cfg
}

// pathEffects writes each message's effect into the unqualified table
// effects, that is, in the schema of the transaction's target, and fails
// for the aggregates in fail.
type pathEffects struct {
	mu   sync.Mutex
	fail map[string]error
}

func (h *pathEffects) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	h.mu.Lock()
	err := h.fail[m.AggregateID]
	h.mu.Unlock()
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO effects (key, aggregate, seq) VALUES ($1, $2, $3)`, m.IdempotencyKey, m.AggregateID, m.Seq)
	return err
}

// health reads the health of consumer "svc" in target t.
func (rt *routeTarget) health(t *testing.T, p *consumer.Processor) consumer.Health {
	t.Helper()
	h, err := p.Target(rt.name).Inspector().Health(context.Background(), "svc")
	require.NoError(t, err)
	return h
}

func TestRouteConfig(t *testing.T) {
	t.Parallel()
	h := consumer.HandlerFunc(func(context.Context, pgxTx, *consumer.Message) error { return nil })
	db := NewMockDB(gomock.NewController(t)) // never called: Handle only checks its config
	owner := func(string, string) (string, error) { return "a", nil }
	tests := []struct {
		name    string
		db      consumer.DB
		route   *consumer.Route
		wantErr string
	}{
		{"Valid", nil, &consumer.Route{Targets: []consumer.Target{{Name: "a", DB: db}, {Name: "b", DB: db}}, Owner: owner}, ""},
		{"DatabaseAndRoute", db, &consumer.Route{Targets: []consumer.Target{{Name: "a", DB: db}}, Owner: owner}, "both a database and Config.Route"},
		{"NoTargets", nil, &consumer.Route{Owner: owner}, "has no targets"},
		{"NoOwner", nil, &consumer.Route{Targets: []consumer.Target{{Name: "a", DB: db}}}, "has no Owner"},
		{"UnnamedTarget", nil, &consumer.Route{Targets: []consumer.Target{{DB: db}}, Owner: owner}, "Targets[0] has no name"},
		{"TargetWithoutDB", nil, &consumer.Route{Targets: []consumer.Target{{Name: "a"}}, Owner: owner}, `target "a" has no database`},
		{"TargetTwice", nil, &consumer.Route{Targets: []consumer.Target{{Name: "a", DB: db}, {Name: "a", DB: db}}, Owner: owner}, "listed twice"},
		{"UnknownFallback", nil, &consumer.Route{Targets: []consumer.Target{{Name: "a", DB: db}}, Owner: owner, Fallback: "z"}, `Fallback names target "z"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := consumer.Handle(tt.db, "svc", h, &consumer.Config{Route: tt.route})
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestRoute(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, md := range modes[:2] {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()

			t.Run("EachRecordInItsTarget", func(t *testing.T) {
				t.Parallel()
				ts := newRouteTargets(t, "a", "b")
				p, err := consumer.Handle(nil, "svc", &pathEffects{}, routeConfig(md.batch, ts))
				require.NoError(t, err)
				require.NoError(t, p.CheckSchema(ctx))
				res := processAll(t, p, md.batch,
					rec("a-1", 1, "k1"), rec("b-1", 1, "k2"), rec("a-1", 2, "k3"), rec("b-1", 2, "k4"),
					rec("b-2", 0, "k5"), rec("a-1", 2, "k3"), rec("b-1", 1, "k2"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.Applied, consumer.Applied,
					consumer.Applied, consumer.Duplicate, consumer.Duplicate}, outcomes(res))
				a, b := ts[0], ts[1]
				require.Equal(t, []int64{1, 2}, a.e.seqs(t, "a-1"))
				require.Equal(t, []int64{1, 2}, b.e.seqs(t, "b-1"))
				require.Equal(t, []int64{0}, b.e.seqs(t, "b-2"))
				rows, _ := a.e.count(t)
				require.Equal(t, 2, rows, "target a holds only its own effects")
				rows, _ = b.e.count(t)
				require.Equal(t, 3, rows, "target b holds only its own effects")
				require.EqualValues(t, 2, a.health(t, p).ProcessedKeys, "target a holds only its own keys")
				require.EqualValues(t, 3, b.health(t, p).ProcessedKeys, "target b holds only its own keys")
				for _, rt := range ts {
					pos, ok, err := p.Target(rt.name).Inspector().Position(ctx, "svc", aggOf(rt.name+"-1"))
					require.NoError(t, err)
					require.True(t, ok)
					require.EqualValues(t, 2, pos)
					_, ok, err = p.Target(rt.name).Inspector().Position(ctx, "svc", aggOf(otherTarget(rt.name)+"-1"))
					require.NoError(t, err)
					require.False(t, ok, "target %s holds no position of the other target's aggregate", rt.name)
				}
			})

			t.Run("UnroutableIsDeadLetteredInFallback", func(t *testing.T) {
				t.Parallel()
				ts := newRouteTargets(t, "a", "b")
				cfg := routeConfig(md.batch, ts)
				cfg.Route.Fallback = "b"
				p, err := consumer.Handle(nil, "svc", &pathEffects{}, cfg)
				require.NoError(t, err)
				res := processAll(t, p, md.batch,
					rec("x-1", 1, "k1"), rec("a-1", 1, "k2"), rec("err-1", 1, "k3"), rec("x-1", 2, "k4"))
				require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Applied, consumer.DeadLettered, consumer.DeadLettered}, outcomes(res))
				hb := ts[1].health(t, p)
				require.Len(t, hb.Letters, 1)
				require.EqualValues(t, 3, hb.Letters[0].Count, "each record that cannot be routed has a letter of its own")
				require.Empty(t, ts[0].health(t, p).Letters)
				letters, err := p.Target("b").Inspector().Letters(ctx, nil)
				require.NoError(t, err)
				require.Len(t, letters, 3)
				for _, l := range letters {
					require.Contains(t, l.Error, "consumer: route aggregate")
				}
				_, err = p.Replay(ctx, letters[0].ID)
				require.ErrorContains(t, err, "Processor.Target(name).Replay")
			})

			t.Run("TargetDownHoldsOnlyItsRecords", func(t *testing.T) {
				t.Parallel()
				ts := newRouteTargets(t, "a", "b")
				p, err := consumer.Handle(nil, "svc", &pathEffects{}, routeConfig(md.batch, ts))
				require.NoError(t, err)
				ts[1].pool.down.Store(true)
				recs := []*kgo.Record{rec("a-1", 1, "k1"), rec("b-1", 1, "k2"), rec("a-1", 2, "k3")}
				for _, r := range recs {
					r.Topic, r.Offset = "orders", nextOffset.Add(1)
				}
				var done int
				if md.batch == 1 {
					for _, r := range recs {
						if _, err = p.Process(ctx, r); err != nil {
							break
						}
						done++
					}
				} else {
					var res []consumer.Result
					res, err = p.ProcessBatch(ctx, recs)
					done = len(res)
				}
				require.ErrorIs(t, err, errServerDown)
				require.Equal(t, 1, done, "no record at or after target b's is reported done")
				// The server is back: the records not reported done are given
				// again, and the one target a applied meanwhile is skipped.
				ts[1].pool.down.Store(false)
				res := processAll(t, p, md.batch, recs[1:]...)
				require.Equal(t, consumer.Applied, res[0].Outcome)
				require.Equal(t, []int64{1}, ts[1].e.seqs(t, "b-1"))
				require.Equal(t, []int64{1, 2}, ts[0].e.seqs(t, "a-1"))
				rows, distinct := ts[0].e.count(t)
				require.Equal(t, rows, distinct, "no effect applied twice")
			})
		})
	}
}

// aggOf is the test records' aggregate id.
func aggOf(id string) ordering.Aggregate { return ordering.Aggregate{Type: "order", ID: id} }

// otherTarget names the other one of the targets a and b.
func otherTarget(name string) string {
	if name == "a" {
		return "b"
	}
	return "a"
}

// routeStream returns n records of each of aggs aggregates in targets a and
// b, interleaved: a-0, b-0, a-1, b-1, ..., then their second records, and
// so on.
func routeStream(aggs, n int) []*kgo.Record {
	var rs []*kgo.Record
	for seq := 1; seq <= n; seq++ {
		for i := range aggs {
			for _, tgt := range []string{"a", "b"} {
				agg := fmt.Sprintf("%s-%d", tgt, i)
				rs = append(rs, rec(agg, int64(seq), fmt.Sprintf("%s-%d", agg, seq)))
			}
		}
	}
	return rs
}

// A Consumer that routes: while target b is down, target a's records are
// applied (all of them above Concurrency 1), but the partition's offset is never committed past b's
// first record; once b is back, a new run applies b's records in b, skips
// a's, and commits everything.
func TestRouteRunner(t *testing.T) {
	t.Parallel()
	for _, md := range runnerModes {
		if md.batchHandler {
			continue
		}
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			b := newGroupBundle(t, 1)
			ts := newRouteTargets(t, "a", "b")
			const aggs, n = 3, 5
			recs := routeStream(aggs, n)
			b.produce(t, recs...)
			cfg := routeConfig(md.batch, ts)
			cfg.Concurrency, cfg.CommitInterval = md.concurrency, 10*time.Millisecond
			start := func() *running {
				cl := b.client(t, b.group)
				c, err := consumer.New(nil, cl, "svc", &pathEffects{}, cfg)
				require.NoError(t, err)
				ctx, cancel := context.WithCancel(context.Background())
				r := &running{c: c, cl: cl, cancel: cancel, done: make(chan error, 1)}
				go func() { r.done <- c.Run(ctx) }()
				t.Cleanup(func() { r.stop(t) })
				return r
			}

			ts[1].pool.down.Store(true)
			r := start()
			// At Concurrency 1 a partition goes strictly in offset order:
			// b's first record holds up the rest (though a batch may have
			// applied some of a's after it). Above, only b's aggregates wait.
			applied := aggs * n
			if md.concurrency <= 1 {
				applied = 1
			}
			eventually.True(t, 30*time.Second, func() bool { rows, _ := ts[0].e.count(t); return rows >= applied }, "target a's records applied")
			eventually.True(t, 30*time.Second, func() bool { return b.committedAt(t, 0) == 1 }, "offset committed up to b's first record")
			r.stop(t)
			require.EqualValues(t, 1, b.committedAt(t, 0), "the last commit does not pass b's first record, whatever a has done")

			ts[1].pool.down.Store(false)
			start()
			eventually.True(t, 30*time.Second, func() bool { return b.committedAt(t, 0) == int64(len(recs)) }, "everything committed")
			want := make([]int64, n)
			for i := range want {
				want[i] = int64(i + 1)
			}
			for _, rt := range ts {
				rows, distinct := rt.e.count(t)
				require.Equal(t, aggs*n, rows, "target %s holds its effects only, each once", rt.name)
				require.Equal(t, rows, distinct)
				for i := range aggs {
					require.Equal(t, want, rt.e.seqs(t, fmt.Sprintf("%s-%d", rt.name, i)))
				}
			}
		})
	}
}
