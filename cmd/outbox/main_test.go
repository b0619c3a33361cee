package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	exec := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append(args[:1:1], append([]string{"-database", db.Server.URL, "-schema", db.Schema}, args[1:]...)...), &out)
		return out.String(), err
	}

	out, err := exec("migrate")
	require.NoError(t, err)
	require.Equal(t, "schema "+db.Schema+" is up to date\n", out)

	out, err = exec("health")
	require.NoError(t, err)
	require.Equal(t, "undelivered 0\noldest_undelivered 0s\ndead 0\n", out)

	_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Table("dead_events")+` (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers, created_at, attempts, last_error, hold)
VALUES (7, gen_random_uuid(), 'k', 'order', '42', 1, 'order.placed', 'x', '{}', now(), 10, 'MESSAGE_TOO_LARGE', true)`)
	require.NoError(t, err)
	var list bytes.Buffer
	require.NoError(t, run(ctx, []string{"dead", "list", "-database", db.Server.URL, "-schema", db.Schema}, &list))
	require.Contains(t, list.String(), "order/42")
	require.Contains(t, list.String(), "MESSAGE_TOO_LARGE")

	var replay bytes.Buffer
	require.NoError(t, run(ctx, []string{"dead", "replay", "-database", db.Server.URL, "-schema", db.Schema, "7"}, &replay))
	require.Equal(t, "dead replay: done for dead event 7\n", replay.String())
	err = run(ctx, []string{"dead", "discard", "-database", db.Server.URL, "-schema", db.Schema, "7"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "no dead event with that id")

	out, err = exec("health")
	require.NoError(t, err)
	require.Contains(t, out, "undelivered 1\n")

	require.ErrorContains(t, run(ctx, nil, &bytes.Buffer{}), "usage:")
	require.ErrorContains(t, run(ctx, []string{"bogus", "-database", db.Server.URL}, &bytes.Buffer{}), `unknown command "bogus"`)
	var sql bytes.Buffer
	require.NoError(t, run(ctx, []string{"sql"}, &sql))
	require.Contains(t, sql.String(), "-- 0001_baseline.sql")
}
