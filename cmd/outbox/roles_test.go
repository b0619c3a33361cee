package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/producer"
)

// TestRoles applies outbox sql -roles and runs the operator's commands
// logged in as a role that holds only the operator group role: it lists
// and replays the producer's dead events, lists a consumer's letters and
// submits their replay, and reads requests, consumers and health.
func TestRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)

	var script bytes.Buffer
	require.NoError(t, run(ctx, []string{"sql", "-roles", "-schema", db.Schema}, &script))
	_, err := db.Pool.Exec(ctx, script.String())
	require.NoError(t, err)
	group := pgx.Identifier{db.Schema + "_operator"}.Sanitize()
	name := "l_" + db.Schema + "_operator"
	role := pgx.Identifier{name}.Sanitize()
	_, err = db.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD 'pw'; GRANT `+group+` TO `+role)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, r := range []string{role, group} {
			_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+r+`; DROP ROLE `+r)
		}
		for _, c := range []string{"writer", "relay", "consumer", "dashboard"} {
			r := pgx.Identifier{db.Schema + "_" + c}.Sanitize()
			_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+r+`; DROP ROLE `+r)
		}
	})
	u, err := url.Parse(db.Server.URL)
	require.NoError(t, err)
	u.User = url.UserPassword(name, "pw")
	asOperator := func(args ...string) (string, error) {
		// The flags go right after the command (and its verb): flag
		// parsing stops at the first argument.
		n := 1
		if subcommands[args[0]] {
			n = 2
		}
		line := append(append(append([]string{}, args[:n]...), "-database", u.String(), "-schema", db.Schema), args[n:]...)
		var out bytes.Buffer
		err := run(ctx, line, &out)
		return out.String(), err
	}

	// A dead event of the producer, and a dead letter of consumer svc.
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Table("dead_events")+` (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers, created_at, attempts, last_error, hold)
VALUES (7, gen_random_uuid(), 'k', 'order', '42', 1, 'order.placed', 'x', '{}', now(), 10, 'MESSAGE_TOO_LARGE', true)`)
	require.NoError(t, err)
	p, err := consumer.Handle(db.Pool, "svc", consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
		return consumer.Permanent(errors.New("broken"))
	}), &consumer.Config{Schema: db.Schema})
	require.NoError(t, err)
	_, err = p.Process(ctx, producer.Record("orders", producer.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.placed", Payload: []byte("v")},
		producer.Stamp{EventID: "evt-1", Seq: 1}))
	require.NoError(t, err)

	for _, args := range [][]string{{"health"}, {"dead", "list"}, {"consumers"}, {"letters", "list"}, {"gaps", "list"}, {"requests"}} {
		_, err := asOperator(args...)
		require.NoError(t, err, "%v", args)
	}
	out, err := asOperator("dead", "replay", "7")
	require.NoError(t, err)
	require.Equal(t, "dead replay: done for dead event 7\n", out)
	out, err = asOperator("letters", "replay", "-consumer", "svc", "-all", "-by", "alice")
	require.NoError(t, err)
	t.Log(out)
	reqs, err := operator.New(&operator.Config{Schema: db.Schema}).List(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Len(t, reqs, 1)
	require.Equal(t, "alice", reqs[0].RequestedBy)
	es, err := operator.New(&operator.Config{Schema: db.Schema}).Audit(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Len(t, es, 2, "the replay of dead event 7 and the request, audited")

	err = run(ctx, []string{"sql", "-roles", "-schema", fmt.Sprintf("%054d", 0)}, &bytes.Buffer{})
	require.ErrorContains(t, err, "at most 53 bytes")
	require.Equal(t, exitUsage, exitCode(err))
}
