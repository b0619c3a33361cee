package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgtest"
)

// TestHostileRecords: what a record's producer wrote never reaches the
// operator's terminal as control characters (a crafted record must not
// clear the screen and print forged text), and listings read no whole
// values.
func TestHostileRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	const ansi = "\x1b[2J\x1b[Hforged\u202e"
	p, err := consumer.Handle(db.Pool, "billing", consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
		return consumer.Permanent(errors.New("bad " + ansi))
	}), &consumer.Config{Schema: db.Schema, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = p.Process(ctx, &kgo.Record{Topic: "orders", Offset: 1, Key: []byte("k" + ansi), Value: []byte(ansi + strings.Repeat("v", 1<<20)),
		Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderEventID, Value: []byte("e-1")},
			{Key: outbox.HeaderAggregateType, Value: []byte("order" + ansi)},
			{Key: outbox.HeaderAggregateID, Value: []byte("o" + ansi)},
			{Key: outbox.HeaderAggregateSeq, Value: []byte("1")},
			{Key: "note" + ansi, Value: []byte(ansi)},
		}})
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO `+db.Table("dead_events")+` (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers, created_at, attempts, last_error, hold)
VALUES (1, gen_random_uuid(), 'k', 'order', $1, 1, 'order.placed', convert_to(repeat('p', 1000000), 'UTF8'), '{}', now(), 10, $1, true)`, "o"+ansi)
	require.NoError(t, err)
	exec := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		n := 1
		if subcommands[args[0]] {
			n = 2
		}
		full := append(append(append([]string{}, args[:n]...), "-database", db.Server.URL, "-schema", db.Schema), args[n:]...)
		require.NoError(t, run(ctx, full, &out))
		return out.String()
	}
	for _, args := range [][]string{{"letters", "list"}, {"letters", "show", "1"}, {"dead", "list"}, {"gaps", "list"}, {"consumers"}} {
		out := exec(args...)
		require.NotContains(t, out, "\x1b", "%v", args)
		require.NotContains(t, out, "\u202e", "%v", args)
		if len(args) < 3 {
			require.Less(t, len(out), 4096, "%v reads no whole values", args)
		}
	}
	require.Contains(t, exec("letters", "show", "1"), `\x1b[2J\x1b[Hforged\u202e`, "escaped, not dropped")
	var dead []map[string]any
	require.NoError(t, json.Unmarshal([]byte(exec("dead", "list", "-o", "json")), &dead))
	require.Len(t, dead, 1)
	require.Equal(t, "o"+ansi, dead[0]["aggregate_id"], "JSON is escaped by its encoding and keeps snake_case names")
	require.EqualValues(t, 1000000, dead[0]["payload_size"])
}
