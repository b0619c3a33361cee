package dashboard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// fixture is one test's world: a schema, a consumer "billing" whose
// handler fails for the aggregates set to fail, and a dashboard on it.
type fixture struct {
	db   *pgtest.DB
	proc *consumer.Processor

	mu sync.Mutex
	// fail maps an aggregate id to the error its records fail with.
	fail map[string]error
	// applied lists the records applied, as "aggregate:seq".
	applied []string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{db: pgtest.New(t, nil), fail: map[string]error{}}
	h := consumer.HandlerFunc(func(_ context.Context, _ pgx.Tx, m *consumer.Message) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if err := f.fail[m.AggregateID]; err != nil {
			return consumer.Permanent(err)
		}
		f.applied = append(f.applied, fmt.Sprintf("%s:%d", m.AggregateID, m.Seq))
		return nil
	})
	p, err := consumer.Handle(f.db.Pool, "billing", h, &consumer.Config{Schema: f.db.Schema, RequestPoll: 20 * time.Millisecond})
	require.NoError(t, err)
	f.proc = p
	return f
}

// setFail makes agg's records fail with err from now on (nil: succeed).
func (f *fixture) setFail(agg string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[agg] = err
}

func (f *fixture) appliedOf(agg string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(f.applied), func(s string) bool { return len(s) <= len(agg) || s[:len(agg)+1] != agg+":" })
}

// process feeds the consumer seqs of aggregate agg (order/agg) with the
// given value.
func (f *fixture) process(t testing.TB, agg string, value string, seqs ...int64) {
	t.Helper()
	for _, seq := range seqs {
		r := producer.Record("orders", producer.Event{AggregateType: "order", AggregateID: agg, EventType: "order.changed", Payload: []byte(value),
			Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
			producer.Stamp{EventID: fmt.Sprintf("evt-%s-%d", agg, seq), Seq: seq})
		r.Offset = seq
		_, err := f.proc.Process(context.Background(), r)
		require.NoError(t, err)
	}
}

// letters seeds the usual data: aggregate o-1 fails at seq 1 (a letter,
// with 2 and 3 parked behind it), o-2 fails another way at seq 1.
func (f *fixture) letters(t *testing.T) {
	t.Helper()
	f.setFail("o-1", errors.New("card processor down"))
	f.setFail("o-2", errors.New("address has no postcode"))
	f.process(t, "o-1", `{"order":"o-1","total_cents":1999}`, 1, 2, 3)
	f.process(t, "o-2", `{"order":"o-2"}`, 1)
}

// backlog gives the producer side something to show: three undelivered
// events and a dead one.
func (f *fixture) backlog(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
		w := producer.NewWriter(&producer.WriterConfig{Schema: f.db.Schema})
		for _, id := range []string{"o-7", "o-8", "o-9"} {
			if _, err := w.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: id, EventType: "order.placed", Payload: []byte(`{}`)}); err != nil {
				return err
			}
		}
		return nil
	}))
	_, err := f.db.Pool.Exec(ctx, `INSERT INTO `+f.db.Table("dead_events")+` (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers, created_at, attempts, last_error, hold)
VALUES (7, gen_random_uuid(), 'k', 'order', '42', 1, 'order.placed', '{"a":1}', '{}', now(), 10, 'MESSAGE_TOO_LARGE', true)`)
	require.NoError(t, err)
}

// open returns billing's open letters of agg.
func (f *fixture) open(t testing.TB, agg string) []*deadletter.Letter {
	t.Helper()
	ls, err := f.proc.Inspector().Letters(context.Background(), &deadletter.ListOpts{Consumer: "billing", Status: deadletter.StatusDead, AggregateID: agg})
	require.NoError(t, err)
	return ls
}

// serveRequests runs the consumer's ServeRequests until the test ends.
func (f *fixture) serveRequests(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.proc.ServeRequests(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// server serves a dashboard on f's schema with cfg (Schema is set).
func (f *fixture) server(t *testing.T, cfg *dashboard.Config) *httptest.Server {
	t.Helper()
	if cfg == nil {
		cfg = &dashboard.Config{}
	}
	cfg.Schema = f.db.Schema
	d, err := dashboard.New(f.db.Pool, cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	return srv
}

// alice authorizes every request as alice.
func alice(*http.Request) (string, bool) { return "alice", true }

var errTest = errors.New("test failure")

// activity gives the overview something to draw and someone alive: a
// relay that delivered 2 events a minute for the last hour, a consumer
// that applied as many, and one live member of it.
func (f *fixture) activity(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	_, err := f.db.Pool.Exec(ctx, `INSERT INTO `+f.db.Table("activity")+` (kind, name, minute, n)
SELECT k, CASE k WHEN 'delivered' THEN 'relay-1' ELSE 'billing' END, date_trunc('minute', now()) - m * interval '1 minute', 2
FROM unnest(ARRAY['delivered', 'applied']) AS k, generate_series(0, 59) AS m`)
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, `INSERT INTO `+f.db.Table("consumer_members")+` (consumer, member_id, group_name, host, pid, partitions, applied)
VALUES ('billing', 'billing-1-host-4242-a1b2c3', 'billing', 'host', 4242, 8, 120)`)
	require.NoError(t, err)
}
