package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

// TestMoveCommands: move start moves aggregates between two shards of a
// fleet file, move status and moves say where it got to on both sides,
// a write on the source is refused afterwards, an aggregate the source
// never numbered moves only with -allow-new, and wrong command lines
// and unknown moves exit with their codes.
func TestMoveCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := pgtest.New(t, nil), pgtest.New(t, nil)
	w := producer.NewWriter(&producer.WriterConfig{Schema: a.Schema})
	tx, err := a.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = w.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: "1", EventType: "e"},
		producer.Event{AggregateType: "order", AggregateID: "2", EventType: "e"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	_, err = a.Pool.Exec(ctx, `UPDATE `+a.Table("events")+` SET published_at = now()`)
	require.NoError(t, err, "as a relay would")

	path := writeFleet(t, shard.Fleet{Shards: []shard.Shard{
		{Name: "a", Database: a.Server.URL, Schema: a.Schema}, {Name: "b", Database: b.Server.URL, Schema: b.Schema}}})
	list := filepath.Join(t.TempDir(), "aggregates")
	require.NoError(t, os.WriteFile(list, []byte("# tenant 7\norder/2\n\n"), 0o600))
	exec := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append(args, "-fleet", path), &out)
		return out.String(), err
	}

	out, err := exec("move", "start", "-from", "a", "-to", "b", "-aggregate", "order/1", "-aggregates", list, "-id", "m1")
	require.NoError(t, err, out)
	require.Contains(t, out, "move m1: done, 2 aggregate(s)")

	out, err = exec("move", "status", "m1", "-from", "a", "-to", "b", "-o", "json")
	require.NoError(t, err, out)
	var st struct {
		ID         string
		State      string
		Aggregates int
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Equal(t, "m1", st.ID)
	require.Equal(t, "done", st.State)
	require.Equal(t, 2, st.Aggregates)

	out, err = exec("moves")
	require.NoError(t, err, out)
	require.Regexp(t, `(?m)^a\s+m1\s+out\s+to b\s+done\s+2\s`, out)
	require.Regexp(t, `(?m)^b\s+m1\s+in\s+from a\s+done\s+2\s`, out)

	tx, err = a.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = w.Write(ctx, tx, producer.Event{AggregateType: "order", AggregateID: "1", EventType: "e"})
	require.ErrorIs(t, err, producer.ErrAggregateMoved, "the source refuses the moved aggregate")

	_, err = exec("move", "start", "-from", "a", "-to", "b", "-aggregate", "order/1")
	require.Equal(t, exitFailed, exitCode(err), "moved already: %v", err)
	require.ErrorContains(t, err, "order")

	_, err = exec("move", "start", "-from", "a", "-to", "b", "-aggregate", "order/9")
	require.Equal(t, exitFailed, exitCode(err), "a never numbered it: %v", err)
	require.ErrorContains(t, err, "-allow-new")
	out, err = exec("move", "start", "-from", "a", "-to", "b", "-aggregate", "order/9", "-allow-new", "-id", "m2")
	require.NoError(t, err, out)
	require.Contains(t, out, "move m2: done, 1 aggregate(s)")

	_, err = exec("move", "status", "nope", "-from", "a", "-to", "b")
	require.Equal(t, exitNotFound, exitCode(err), "%v", err)
	_, err = exec("move", "resume", "nope", "-from", "a", "-to", "b")
	require.Equal(t, exitNotFound, exitCode(err), "%v", err)
	for _, args := range [][]string{
		{"move", "start", "-from", "a", "-to", "b"},
		{"move", "start", "-from", "a", "-to", "a", "-aggregate", "order/3"},
		{"move", "start", "-from", "a", "-to", "x", "-aggregate", "order/3"},
		{"move", "start", "-to", "b", "-aggregate", "order/3"},
		{"move", "start", "-from", "a", "-to", "b", "-aggregate", "order"},
		{"move", "start", "-from", "a", "-to", "b", "-aggregate", "/3"},
		{"move", "status", "-from", "a", "-to", "b"},
		{"move", "start", "-from", "a", "-to", "b", "-aggregates", filepath.Join(t.TempDir(), "missing")},
	} {
		_, err := exec(args...)
		require.Equal(t, exitUsage, exitCode(err), "%v: %v", args, err)
	}
	var out2 bytes.Buffer
	err = run(ctx, []string{"move", "start", "-from", "a", "-to", "b", "-aggregate", "order/3", "-database", a.Server.URL}, &out2)
	require.Equal(t, exitUsage, exitCode(err), "one database is no fleet: %v", err)
}
