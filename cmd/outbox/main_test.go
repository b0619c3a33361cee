package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/operator"
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
	require.ErrorContains(t, err, "producer: discard dead event 7: it is replayed")
	require.ErrorIs(t, err, deadletter.ErrResolved)
	require.Equal(t, exitFailed, exitCode(err), "a dead event replayed already is there: the discard failed")
	err = run(ctx, []string{"dead", "replay", "-database", db.Server.URL, "-schema", db.Schema, "8"}, &bytes.Buffer{})
	require.EqualError(t, err, "producer: replay dead event 8: outbox: not found")
	require.Equal(t, exitNotFound, exitCode(err))
	es, err := operator.New(&operator.Config{Schema: db.Schema}).Audit(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Len(t, es, 3)
	require.Equal(t, operator.ReplayEvent, es[0].Action)
	require.Equal(t, operator.OutcomeFailed, es[0].Outcome)
	require.Equal(t, operator.DiscardEvent, es[1].Action)
	require.Equal(t, operator.OutcomeFailed, es[1].Outcome)
	require.Equal(t, operator.ReplayEvent, es[2].Action)
	require.Equal(t, operator.OutcomeReplayed, es[2].Outcome)
	require.Equal(t, "dead event 7", es[2].Detail)

	out, err = exec("health")
	require.NoError(t, err)
	require.Contains(t, out, "undelivered 1\n")

	out, err = exec("consumers")
	require.NoError(t, err)
	require.Equal(t, "CONSUMER  LIVE  LETTERS  PARKED  AGGS  OLDEST GAP  KEYS  OLDEST KEY  HORIZON\n", out)
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Table("processed_keys")+` (consumer, key, processed_at) VALUES ('billing', 'k1', now() - interval '3 days'), ('billing', 'k2', now())`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Table("dead_letters")+` (consumer, topic, kafka_partition, kafka_offset, header_keys, header_values, error, attempts, fingerprint)
VALUES ('shipping', 'orders', 0, 9, '{}', '{}', 'downstream broken', 5, '\x00')`)
	require.NoError(t, err)
	out, err = exec("consumers")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^billing\s+0\s+0\s+0\s+0\s+-\s+2\s+3d\s+43%$`, out)
	require.Regexp(t, `(?m)^shipping\s+0\s+1\s+0\s+0\s+-\s+0\s+-\s+0%$`, out)
	for _, line := range strings.Split(out, "\n") {
		require.LessOrEqual(t, len(line), 80, "fits 80 columns: %q", line)
	}
	out, err = exec("consumers", "-o", "json")
	require.NoError(t, err)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 2)
	require.Equal(t, "billing", rows[0]["consumer"])
	require.EqualValues(t, 2, rows[0]["processed_keys"])
	require.EqualValues(t, 1, rows[1]["open_dead_letters"])
	require.InDelta(t, 3.0/7, rows[0]["key_horizon_used"], 0.01)
	out, err = exec("consumers", "-key-retention", "72h")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^billing\s.*\s100%$`, out, "at the horizon")
	_, err = exec("consumers", "-o", "yaml")
	require.ErrorContains(t, err, "want table or json")

	require.ErrorContains(t, run(ctx, nil, &bytes.Buffer{}), "usage:")
	require.ErrorContains(t, run(ctx, nil, &bytes.Buffer{}), "-reason: handler, panic, timeout, sequence, input, delivery_limit, conflict)")
	err = run(ctx, []string{"letters", "list", "-database", db.Server.URL, "-schema", db.Schema, "-reason", "handlr"}, &bytes.Buffer{})
	require.Equal(t, exitUsage, exitCode(err))
	require.ErrorContains(t, err, `-reason "handlr": want one of handler, panic, timeout, sequence, input, delivery_limit`)
	err = run(ctx, []string{"dead", "list", "-database", db.Server.URL, "-schema", db.Schema, "-status", "gone"}, &bytes.Buffer{})
	require.Equal(t, exitUsage, exitCode(err))
	require.ErrorContains(t, err, `-status "gone": want dead, replayed, discarded or all`)
	require.ErrorContains(t, run(ctx, []string{"bogus", "-database", db.Server.URL}, &bytes.Buffer{}), `unknown command "bogus"`)
	var sql bytes.Buffer
	require.NoError(t, run(ctx, []string{"sql"}, &sql))
	require.Contains(t, sql.String(), "-- 0001_baseline.sql")
}
