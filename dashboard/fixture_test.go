package dashboard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/letterworld"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// fixture is one test's world (the consumer "billing" of
// internal/letterworld) with the dashboard's own helpers around it.
type fixture struct {
	*letterworld.World
	db   *pgtest.DB
	proc *consumer.Processor
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	w := letterworld.New(t)
	return &fixture{World: w, db: w.DB, proc: w.Proc}
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
// relay that delivered 2 events a minute in the last 59 minutes (118), a
// consumer that applied as many, and one live member of it. 59, not 60:
// the oldest of 60 minutes leaves the page's last hour when a minute
// turns between this insert and the page view.
func (f *fixture) activity(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	_, err := f.db.Pool.Exec(ctx, `INSERT INTO `+f.db.Table("activity")+` (kind, name, minute, n)
SELECT k, CASE k WHEN 'delivered' THEN 'relay-1' ELSE 'billing' END, date_trunc('minute', now()) - m * interval '1 minute', 2
FROM unnest(ARRAY['delivered', 'applied']) AS k, generate_series(0, 58) AS m`)
	require.NoError(t, err)
	_, err = f.db.Pool.Exec(ctx, `INSERT INTO `+f.db.Table("consumer_members")+` (consumer, member_id, group_name, host, pid, partitions, applied)
VALUES ('billing', 'billing-1-host-4242-a1b2c3', 'billing', 'host', 4242, 8, 120)`)
	require.NoError(t, err)
}
