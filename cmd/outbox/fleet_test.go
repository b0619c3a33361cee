package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/shard"
)

// writeFleet writes f as a fleet file and returns its path.
func writeFleet(t *testing.T, f shard.Fleet) string {
	t.Helper()
	body, err := json.Marshal(f)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "fleet.json")
	require.NoError(t, os.WriteFile(path, body, 0o600))
	return path
}

// refused is a database address where nothing listens.
func refused(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "postgres://outbox@" + addr + "/outbox?sslmode=disable"
}

// TestFleetReads: the read commands answer per shard over schemas of the
// test database, one shard whose schema does not exist, one whose server
// refuses connections and one with a hostile schema name; the shards that
// answer are all there, the others say their error, and the command exits
// with code 1.
func TestFleetReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b, c := pgtest.New(t, nil), pgtest.New(t, nil), pgtest.New(t, nil)
	_, err := b.Pool.Exec(ctx, `INSERT INTO `+b.Table("dead_events")+` (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers, created_at, attempts, last_error, hold)
VALUES (7, gen_random_uuid(), 'k', 'order', '42', 1, 'order.placed', 'x', '{}', now(), 10, 'MESSAGE_TOO_LARGE', true)`)
	require.NoError(t, err)
	_, err = c.Pool.Exec(ctx, `INSERT INTO `+c.Table("processed_keys")+` (consumer, key, processed_at) VALUES ('billing', 'k1', now() - interval '3 days'), ('billing', 'k2', now())`)
	require.NoError(t, err)
	_, err = a.Pool.Exec(ctx, `INSERT INTO `+a.Table("dead_letters")+` (consumer, topic, kafka_partition, kafka_offset, header_keys, header_values, error, attempts, fingerprint)
VALUES ('shipping', 'orders', 0, 9, '{}', '{}', 'downstream broken', 5, '\x00')`)
	require.NoError(t, err)
	_, err = a.Pool.Exec(ctx, `INSERT INTO `+a.Table("processed_keys")+` (consumer, key, processed_at) VALUES ('billing', 'k1', now() - interval '1 day')`)
	require.NoError(t, err)
	url := a.Server.URL
	down := refused(t)
	const hostile = "evil\x1b[2J\u202e"
	f := shard.Fleet{
		Shards: []shard.Shard{{Name: "a", Database: url, Schema: a.Schema}, {Name: "b", Database: url, Schema: b.Schema},
			{Name: "gone", Database: url, Schema: "no_such_schema"}, {Name: "down", Database: down}, {Name: "evil", Database: url, Schema: hostile},
			{Name: "c", Database: url, Schema: c.Schema}},
		Targets: []shard.Shard{{Name: "a", Database: url, Schema: a.Schema}, {Name: "down", Database: down}, {Name: "c", Database: url, Schema: c.Schema}},
	}
	path := writeFleet(t, f)
	exec := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append(args, "-fleet", path), &out)
		if !slices.Contains(args, "json") {
			require.NotContains(t, out.String(), "\x1b", "no control characters reach the terminal")
			require.NotContains(t, out.String(), "\u202e")
		}
		return out.String(), err
	}

	out, err := exec("health")
	require.Equal(t, exitError, exitCode(err), "a shard did not answer")
	require.EqualError(t, err, "3 of 6 shards did not answer: gone, down, evil")
	require.Regexp(t, `(?m)^SHARD\s+UNDELIVERED\s+OLDEST\s+DEAD\s+ERROR$`, out)
	require.Regexp(t, `(?m)^a\s+0\s+-\s+0$`, out)
	require.Regexp(t, `(?m)^b\s+0\s+-\s+1$`, out)
	require.Regexp(t, `(?m)^c\s+0\s+-\s+0$`, out)
	require.Regexp(t, `(?m)^gone\s+ERROR\s+outbox: schema not migrated`, out)
	require.Regexp(t, `(?m)^shard gone: .*schema "no_such_schema" has no outbox tables`, out, "the whole error below the table")
	require.Regexp(t, `(?m)^shard down: .*connection refused`, out)
	require.Regexp(t, `(?m)^down\s+ERROR\s+`, out)
	require.Regexp(t, `(?m)^evil\s+ERROR\s+`, out)
	require.Regexp(t, `(?m)^TOTAL\s+0\s+-\s+1$`, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Equal(t, []string{"SHARD", "a", "b", "gone", "down", "evil", "c", "TOTAL"}, firstWords(lines[:8]), "in the file's order")

	out, err = exec("health", "-o", "json")
	require.Equal(t, exitError, exitCode(err))
	var h struct {
		Shards []map[string]any `json:"shards"`
		Total  healthRow        `json:"total"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &h))
	require.Len(t, h.Shards, 6)
	require.Equal(t, "b", h.Shards[1]["shard"])
	require.EqualValues(t, 1, h.Shards[1]["dead"])
	require.Contains(t, h.Shards[2]["error"], `schema "no_such_schema" has no outbox tables`)
	require.NotContains(t, h.Shards[2], "dead", "a shard that failed has no figures, not zeros")
	require.Equal(t, healthRow{Dead: 1}, h.Total)

	out, err = exec("dead", "list")
	require.Equal(t, exitError, exitCode(err))
	require.Regexp(t, `(?m)^SHARD\s+ID\s+AGGREGATE\s+SEQ`, out)
	require.Regexp(t, `(?m)^b\s+7\s+order/42\s+1\s+order.placed\s+dead\s+10\s`, out)
	require.Regexp(t, `(?m)^shard gone: .*schema "no_such_schema" has no outbox tables`, out, "the whole error below the table")

	out, err = exec("consumers")
	require.Equal(t, exitError, exitCode(err))
	require.EqualError(t, err, "1 of 3 shards did not answer: down", "consumer commands read the targets")
	require.Regexp(t, `(?m)^a\s+shipping\s+0\s+1\s+0\s+0\s+-\s+0\s+-\s+0%$`, out)
	require.Regexp(t, `(?m)^c\s+billing\s+0\s+0\s+0\s+0\s+-\s+2\s+3d\s+43%$`, out)
	require.Regexp(t, `(?m)^a\s+billing\s+0\s+0\s+0\s+0\s+-\s+1\s+24h0m0s\s+14%$`, out)
	require.Regexp(t, `(?m)^down\s+ERROR\s`, out)
	require.Regexp(t, `(?m)^TOTAL\s+billing\s+0\s+0\s+0\s+0\s+-\s+3\s+3d\s+43%$`, out, "billing over both targets")
	require.Regexp(t, `(?m)^TOTAL\s+shipping\s+0\s+1\s+0\s+0\s+-\s+0\s+-\s+0%$`, out)
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "shard ") { // the errors in full
			require.LessOrEqual(t, len([]rune(line)), 80, "the table fits 80 columns: %q", line)
		}
	}

	out, err = exec("consumers", "-o", "json")
	require.Equal(t, exitError, exitCode(err))
	var cs struct {
		Shards []struct {
			Shard  string        `json:"shard"`
			Error  string        `json:"error"`
			Result []consumerRow `json:"result"`
		} `json:"shards"`
		Total []consumerRow `json:"total"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &cs))
	require.Len(t, cs.Shards, 3)
	require.Equal(t, "c", cs.Shards[2].Shard)
	require.Equal(t, "billing", cs.Shards[2].Result[0].Consumer)
	require.EqualValues(t, 2, cs.Shards[2].Result[0].ProcessedKeys)
	require.NotEmpty(t, cs.Shards[1].Error)
	require.Len(t, cs.Total, 2)
	require.Equal(t, "billing", cs.Total[0].Consumer)
	require.EqualValues(t, 3, cs.Total[0].ProcessedKeys, "the keys of both targets")

	out, err = exec("letters", "list")
	require.Equal(t, exitError, exitCode(err))
	require.Regexp(t, `(?m)^a\s+\d+\s+shipping\s+-\s+-\s+`, out)
	out, err = exec("gaps", "list")
	require.Equal(t, exitError, exitCode(err))
	require.Regexp(t, `(?m)^SHARD\s+CONSUMER\s+AGGREGATE`, out)
	out, err = exec("requests")
	require.Equal(t, exitError, exitCode(err))
	require.Regexp(t, `(?m)^SHARD\s+ID\s+CONSUMER`, out)

	out, err = exec("consumers", "-shard", "c")
	require.NoError(t, err, "one shard that answers")
	require.Regexp(t, `(?m)^billing\s`, out, "one shard's table, as without a fleet")
	require.NotContains(t, out, "shipping")
}

// firstWords is each line's first word.
func firstWords(lines []string) []string {
	words := make([]string, 0, len(lines))
	for _, l := range lines {
		words = append(words, strings.Fields(l)[0])
	}
	return words
}

// TestFleetChanges: a command that changes data runs on the one shard
// -shard names, and is refused on a whole fleet.
func TestFleetChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := pgtest.New(t, nil), pgtest.New(t, nil)
	for _, db := range []*pgtest.DB{a, b} {
		_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("dead_events")+` (id, event_id, idempotency_key, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers, created_at, attempts, last_error, hold)
VALUES (7, gen_random_uuid(), 'k', 'order', '42', 1, 'order.placed', 'x', '{}', now(), 10, 'MESSAGE_TOO_LARGE', true)`)
		require.NoError(t, err)
	}
	path := writeFleet(t, shard.Fleet{Shards: []shard.Shard{{Name: "a", Database: a.Server.URL, Schema: a.Schema}, {Name: "b", Database: b.Server.URL, Schema: b.Schema}},
		Targets: []shard.Shard{{Name: "t", Database: a.Server.URL, Schema: a.Schema}}})

	for _, args := range [][]string{{"dead", "replay", "7"}, {"dead", "discard", "7"}, {"letters", "replay", "-consumer", "billing", "-all"},
		{"letters", "discard", "3"}, {"letters", "show", "3"}, {"gaps", "resolve", "-consumer", "billing", "-aggregate-type", "order", "-aggregate-id", "1"},
		{"requests", "cancel", "3"}} {
		err := run(ctx, append(args, "-fleet", path), io.Discard)
		require.Equal(t, exitUsage, exitCode(err), "%v", args)
		require.ErrorContains(t, err, "changes one shard: with a fleet, name it with -shard NAME (", "%v", args)
	}
	err := run(ctx, []string{"dead", "replay", "7", "-fleet", path, "-shard", "t"}, io.Discard)
	require.Equal(t, exitUsage, exitCode(err))
	require.ErrorContains(t, err, `-shard "t" is not one of the fleet's shards: a, b`)

	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"dead", "replay", "7", "-fleet", path, "-shard", "b"}, &out))
	require.Equal(t, "dead replay: done for dead event 7\n", out.String())
	var status string
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT status FROM `+b.Table("dead_events")+` WHERE id = 7`).Scan(&status))
	require.Equal(t, "replayed", status)
	require.NoError(t, a.Pool.QueryRow(ctx, `SELECT status FROM `+a.Table("dead_events")+` WHERE id = 7`).Scan(&status))
	require.Equal(t, "dead", status, "the other shard is untouched")

	err = run(ctx, []string{"health", "-fleet", path, "-database", a.Server.URL}, io.Discard)
	require.Equal(t, exitUsage, exitCode(err))
	require.ErrorContains(t, err, "-fleet names the databases and schemas: drop -database and -schema, or -fleet")
	err = run(ctx, []string{"sql", "-database", a.Server.URL, "-database", b.Server.URL}, io.Discard)
	require.Equal(t, exitUsage, exitCode(err))
	require.ErrorContains(t, err, "sql: -database given 2 times: sql runs on one database")
	err = run(ctx, []string{"health", "-shard", "a", "-database", a.Server.URL}, io.Discard)
	require.Equal(t, exitUsage, exitCode(err))
	require.ErrorContains(t, err, "-shard names a shard of -fleet FILE or of repeated -database")
}

// TestFleetRepeatedDatabase: -database repeated is a fleet of one shard
// each, in -schema, named by position and database name.
func TestFleetRepeatedDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := pgtest.New(t, nil)
	down := refused(t)
	var out bytes.Buffer
	err := run(ctx, []string{"health", "-database", a.Server.URL, "-database", down, "-schema", a.Schema}, &out)
	require.Equal(t, exitError, exitCode(err))
	require.EqualError(t, err, "1 of 2 shards did not answer: 2-outbox")
	require.Regexp(t, `(?m)^1-\S+\s+0\s+-\s+0$`, out.String())
	require.Regexp(t, `(?m)^2-outbox\s+ERROR\s`, out.String())

	err = run(ctx, []string{"health", "-database", a.Server.URL, "-database", a.Server.URL, "-schema", a.Schema}, io.Discard)
	require.Equal(t, exitUsage, exitCode(err))
	require.ErrorContains(t, err, "are the same database and schema")
}

// hangingServer accepts connections and never answers them; it counts
// them, and the most open at once, and gives each to held. The test closes
// them (release): a client that gave up stays counted until then.
type hangingServer struct {
	addr              string
	held              chan net.Conn
	mu                sync.Mutex
	open, most, total int
}

func newHangingServer(t *testing.T) *hangingServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &hangingServer{addr: l.Addr().String(), held: make(chan net.Conn, 1000)}
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		close(s.held)
		for c := range s.held {
			_ = c.Close()
		}
	})
	go func() {
		defer close(done)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			// A cancel request (length 16, code 80877102) is closed
			// at once, as PostgreSQL closes it: it is not a shard's
			// connection.
			head := make([]byte, 8)
			if _, err := io.ReadFull(conn, head); err != nil || binary.BigEndian.Uint32(head[4:]) == 80877102 {
				_ = conn.Close()
				continue
			}
			s.mu.Lock()
			s.open++
			s.total++
			s.most = max(s.most, s.open)
			s.mu.Unlock()
			s.held <- conn
		}
	}()
	return s
}

// release closes one held connection.
func (s *hangingServer) release(conn net.Conn) {
	s.mu.Lock()
	s.open--
	s.mu.Unlock()
	_ = conn.Close()
}

func (s *hangingServer) counts() (open, most, total int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open, s.most, s.total
}

// fleetOn is a fleet of n shards on the server at addr.
func fleetOn(t *testing.T, addr string, n int) string {
	t.Helper()
	list := make([]shard.Shard, 0, n)
	for i := range n {
		list = append(list, shard.Shard{Name: fmt.Sprintf("s%d", i), Database: "postgres://outbox@" + addr + "/outbox?sslmode=disable",
			Schema: fmt.Sprintf("s%d", i)})
	}
	return writeFleet(t, shard.Fleet{Shards: list})
}

// TestFleetTimeout: shards that accept a connection and never answer hold
// the command no longer than -shard-timeout each, and say so.
func TestFleetTimeout(t *testing.T) {
	t.Parallel()
	srv := newHangingServer(t)
	const n = 3
	var out bytes.Buffer
	err := run(context.Background(), []string{"health", "-fleet", fleetOn(t, srv.addr, n), "-shard-timeout", "200ms"}, &out)
	require.Equal(t, exitError, exitCode(err))
	require.EqualError(t, err, "3 of 3 shards did not answer: s0, s1, s2")
	for i := range n {
		require.Regexp(t, fmt.Sprintf(`(?m)^shard s%d: no answer within -shard-timeout 200ms: `, i), out.String())
	}
}

// TestFleetParallel: a fleet command has at most fleetParallel shards'
// connections open at once, and as many as that: the server holds every
// connection until the test closes it, one at a time.
func TestFleetParallel(t *testing.T) {
	t.Parallel()
	srv := newHangingServer(t)
	const n = 3 * fleetParallel
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"health", "-fleet", fleetOn(t, srv.addr, n), "-shard-timeout", "1m"}, io.Discard)
	}()
	eventually.True(t, 30*time.Second, func() bool { open, _, _ := srv.counts(); return open == fleetParallel },
		"fleetParallel shards connect at once")
	for released := range n {
		select {
		case conn := <-srv.held:
			srv.release(conn)
		case <-time.After(30 * time.Second):
			t.Fatalf("after %d connections closed, the next shard did not connect", released)
		}
	}
	err := <-done
	require.Equal(t, exitError, exitCode(err))
	require.ErrorContains(t, err, fmt.Sprintf("%d of %d shards did not answer", n, n))
	_, most, total := srv.counts()
	require.Equal(t, n, total, "every shard was tried")
	require.Equal(t, fleetParallel, most, "at most fleetParallel shards at once")
}
