package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

func TestRolesSQLRefusesBadSchemas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, schema, want string }{
		{"TooLong", strings.Repeat("s", 54), "at most 53 bytes"},
		{"NUL", "a\x00b", "NUL"},
		{"Dollar", "a$roles$b", "$"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := outbox.RolesSQL(tc.schema)
			require.ErrorContains(t, err, tc.want)
		})
	}
	sql, err := outbox.RolesSQL(strings.Repeat("s", 53))
	require.NoError(t, err)
	require.Contains(t, sql, `"`+strings.Repeat("s", 53)+`_dashboard"`)
	sql, err = outbox.RolesSQL("")
	require.NoError(t, err)
	require.Contains(t, sql, `GRANT USAGE ON SCHEMA "outbox" TO "outbox_writer"`)
	sql, err = outbox.RolesSQL(`we"ird`)
	require.NoError(t, err)
	require.Contains(t, sql, `"we""ird".events`)
	require.Contains(t, sql, `'we"ird_writer'`)
}

// TestRoles runs each component logged in as a role that holds only its
// group role from RolesSQL, against real PostgreSQL: a permission the
// component needs and the script does not grant fails its step.
func TestRoles(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned=%v", partitioned), func(t *testing.T) {
			t.Parallel()
			testRoles(t, partitioned)
		})
	}
}

func testRoles(t *testing.T, partitioned bool) {
	ctx := context.Background()
	db := pgtest.New(t, &pgtest.Opts{PartitionEventsByDay: partitioned})
	sql, err := outbox.RolesSQL(db.Schema)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, sql)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, sql)
	require.NoError(t, err, "the script is idempotent")
	t.Cleanup(func() { dropRoles(db) })
	// The consumer's handler writes to the service's own table, which the
	// service grants its consumer's login role itself.
	shipments := db.Table("shipments")
	_, err = db.Pool.Exec(ctx, `CREATE TABLE `+shipments+` (aggregate_id text, step text)`)
	require.NoError(t, err)

	login := func(component string) *pgxpool.Pool {
		t.Helper()
		name := "l_" + db.Schema + "_" + component
		role := pgx.Identifier{name}.Sanitize()
		_, err := db.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD 'pw'; GRANT `+pgx.Identifier{db.Schema + "_" + component}.Sanitize()+` TO `+role)
		require.NoError(t, err)
		return connectAs(t, db, name)
	}
	writerPool, relayPool, consumerPool, operatorPool, dashboardPool :=
		login("writer"), login("relay"), login("consumer"), login("operator"), login("dashboard")
	_, err = db.Pool.Exec(ctx, `GRANT SELECT, INSERT ON `+shipments+` TO `+pgx.Identifier{"l_" + db.Schema + "_consumer"}.Sanitize())
	require.NoError(t, err)

	broker := kafkatest.New(t)
	topic := broker.Topic(t, 1)

	// writer: writes three events of one aggregate.
	w := producer.NewWriter(&producer.WriterConfig{Schema: db.Schema})
	require.NoError(t, pgx.BeginFunc(ctx, writerPool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx,
			producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "placed", Payload: []byte("ok-1"), Topic: topic},
			producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "paid", Payload: []byte("bad-2"), Topic: topic},
			producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "shipped", Payload: []byte("ok-3"), Topic: topic})
		return err
	}), "writer")

	// relay: delivers them to the broker.
	relayCfg := &producer.RelayConfig{Schema: db.Schema, Logger: quietLogger}
	if partitioned {
		// Pruning day partitions needs the owner (roles.sql says so).
		relayCfg.Retention = -1
		_, err := producer.Prune(ctx, relayPool, &producer.PruneConfig{Schema: db.Schema})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "42501", pgErr.Code, "insufficient_privilege: %v", err)
		_, err = producer.Prune(ctx, db.Pool, &producer.PruneConfig{Schema: db.Schema})
		require.NoError(t, err)
	}
	relay, err := producer.NewRelay(relayPool, broker.Client(t), relayCfg)
	require.NoError(t, err)
	runCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(runCtx) }()
	recs := broker.Records(t, topic, 3, time.Minute)
	stopRelay()
	if err := <-relayDone; err != nil {
		t.Fatalf("relay: %v", err)
	}
	require.Len(t, recs, 3, "relay")
	in, err := producer.NewInspector(relayPool, db.Schema)
	require.NoError(t, err)
	h, err := in.Health(ctx)
	require.NoError(t, err)
	require.Zero(t, h.Undelivered)

	// consumer: applies 1, dead-letters 2 (its handler refuses "bad"
	// payloads until fixed), parks 3 behind it, and serves the replay.
	fixed := false
	p, err := consumer.Handle(consumerPool, "svc", consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if strings.HasPrefix(string(m.Value), "bad") && !fixed {
			return consumer.Permanent(errors.New("bad payload"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+shipments+` VALUES ($1, $2)`, m.AggregateID, m.Value)
		return err
	}), &consumer.Config{Schema: db.Schema, RequestPoll: 20 * time.Millisecond, Logger: quietLogger})
	require.NoError(t, err)
	var outcomes []string
	for _, r := range recs {
		res, err := p.Process(ctx, r)
		require.NoError(t, err, "consumer")
		outcomes = append(outcomes, fmt.Sprint(res.Outcome))
	}
	require.Equal(t, []string{"applied", "dead_lettered", "parked"}, outcomes)

	// operator: reads the letter and submits its replay, which the
	// consumer serves.
	reads, err := consumer.NewInspector(operatorPool, db.Schema)
	require.NoError(t, err)
	letters, err := reads.Letters(ctx, &deadletter.ListOpts{Consumer: "svc", Status: deadletter.StatusDead})
	require.NoError(t, err, "operator lists letters")
	require.Len(t, letters, 1)
	fixed = true
	serveCtx, stopServe := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- p.ServeRequests(serveCtx) }()
	ops := operator.New(&operator.Config{Schema: db.Schema})
	opCtx, cancel := context.WithTimeout(operator.WithActor(ctx, "alice"), time.Minute)
	defer cancel()
	id, err := ops.Submit(opCtx, operatorPool, &operator.Request{Consumer: "svc", Action: operator.Replay, LetterID: letters[0].ID})
	require.NoError(t, err, "operator submits")
	req, err := ops.Wait(opCtx, operatorPool, id, 20*time.Millisecond)
	require.NoError(t, err)
	stopServe()
	require.NoError(t, <-served)
	require.Equal(t, operator.Done, req.Status, req.Error)
	require.Equal(t, operator.Progress{Matched: 1, Applied: 1, Drained: 1}, req.Progress)
	entries, err := ops.Audit(ctx, operatorPool, &operator.AuditOpts{RequestID: id})
	require.NoError(t, err, "operator reads the audit")
	require.Len(t, entries, 2)
	var steps []string
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT step FROM `+shipments+` ORDER BY step`)
		if err != nil {
			return err
		}
		steps, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}))
	require.Equal(t, []string{"bad-2", "ok-1", "ok-3"}, steps)

	// dashboard: renders its pages read-only.
	d, err := dashboard.New(dashboardPool, &dashboard.Config{Schema: db.Schema, Logger: quietLogger})
	require.NoError(t, err)
	for _, path := range []string{"/", "/producer/dead", "/consumers/svc/letters", "/consumers/svc/gaps", "/consumers/svc/search?key=k", "/requests",
		fmt.Sprintf("/consumers/svc/letters/%d", letters[0].ID)} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr, req.Host = "127.0.0.1:1234", "localhost"
		d.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, "dashboard %s: %s", path, rec.Body.String())
	}
	// operator: moves the aggregate to a second shard (a schema with
	// roles of its own), where the writer goes on at the next sequence.
	db2 := pgtest.New(t, &pgtest.Opts{PartitionEventsByDay: partitioned})
	sql2, err := outbox.RolesSQL(db2.Schema)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, sql2)
	require.NoError(t, err)
	t.Cleanup(func() { dropRoles(db2) })
	mover := "l_" + db.Schema + "_mover"
	_, err = db.Pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{mover}.Sanitize()+` LOGIN PASSWORD 'pw'; GRANT `+
		pgx.Identifier{db.Schema + "_operator"}.Sanitize()+`, `+pgx.Identifier{db2.Schema + "_operator"}.Sanitize()+` TO `+pgx.Identifier{mover}.Sanitize())
	require.NoError(t, err)
	moverPool := connectAs(t, db, mover)
	from := move.Endpoint{Shard: shard.Shard{Name: "one", Schema: db.Schema}, DB: moverPool}
	to := move.Endpoint{Shard: shard.Shard{Name: "two", Schema: db2.Schema}, DB: moverPool}
	_, err = move.Run(ctx, from, to, []move.Aggregate{{Type: "order", ID: "o-1"}}, &move.Config{PollInterval: 10 * time.Millisecond, Logger: quietLogger})
	require.NoError(t, err, "operator moves")
	require.ErrorIs(t, pgx.BeginFunc(ctx, writerPool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "e", Topic: topic})
		return err
	}), producer.ErrAggregateMoved, "writer on the source")
	var seq int64
	require.NoError(t, pgx.BeginFunc(ctx, db2.Pool, func(tx pgx.Tx) error {
		out, err := producer.NewWriter(&producer.WriterConfig{Schema: db2.Schema}).Write(ctx, tx,
			producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "e", Topic: topic})
		if err == nil {
			seq = out[0].Seq
		}
		return err
	}))
	require.Equal(t, int64(4), seq, "the target goes on at the next sequence")

	// ... and can write nothing.
	for _, stmt := range []string{
		`DELETE FROM ` + db.Table("dead_letters"),
		`UPDATE ` + db.Table("operator_requests") + ` SET status = 'failed'`,
		`INSERT INTO ` + db.Table("operator_audit") + ` (actor, consumer, action, outcome) VALUES ('x', 'svc', 'replay', 'x')`,
		`DELETE FROM ` + db.Table("events"),
	} {
		_, err := dashboardPool.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, stmt)
		require.Equal(t, "42501", pgErr.Code, "insufficient_privilege: %s", stmt)
	}
}

var quietLogger = slog.New(slog.DiscardHandler)

// dropRoles drops db's schema's group roles from RolesSQL.
func dropRoles(db *pgtest.DB) {
	for _, r := range []string{"writer", "relay", "consumer", "operator", "dashboard"} {
		role := pgx.Identifier{db.Schema + "_" + r}.Sanitize()
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role)
	}
}

// connectAs returns a pool on db's server logged in as role name with
// password pw, closed and the role dropped when the test ends.
func connectAs(t *testing.T, db *pgtest.DB, name string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(db.Server.URL)
	require.NoError(t, err)
	u.User = url.UserPassword(name, "pw")
	pool, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	role := pgx.Identifier{name}.Sanitize()
	t.Cleanup(func() {
		pool.Close()
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE `+role)
	})
	return pool
}
