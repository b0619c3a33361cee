package cdc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/kafkatest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/producer"
)

// Environment the tests read.
const (
	requireEnv      = "INTEGRATION_REQUIRE_KAFKA" // set: a missing piece fails instead of skipping
	connectURLEnv   = "CONNECT_URL"               // the worker's REST API, from connect.sh start
	connectScrptEnv = "CONNECT_SCRIPT"            // connect.sh, to kill and restart the worker
)

// world is what every test needs: the broker, the Connect worker and a
// PostgreSQL server with wal_level=logical.
type world struct {
	broker  *kafkatest.Broker
	connect string // REST URL
	script  string // connect.sh; "" when not given
}

// need returns the world, skipping the test when no broker is given and
// INTEGRATION_REQUIRE_KAFKA is unset, and failing it when a piece is
// missing otherwise.
func need(t testing.TB) *world {
	t.Helper()
	require := os.Getenv(requireEnv) != ""
	if os.Getenv("KAFKA_BROKERS") == "" {
		if require {
			t.Fatalf("%s is set but KAFKA_BROKERS is empty; start a broker with integration/kafka/broker.sh start", requireEnv)
		}
		t.Skip("KAFKA_BROKERS is not set: CDC needs a real broker and a Connect worker (integration/kafka/broker.sh, integration/connect/connect.sh)")
	}
	w := &world{broker: kafkatest.New(t), connect: os.Getenv(connectURLEnv), script: os.Getenv(connectScrptEnv)}
	if w.connect == "" {
		if require {
			t.Fatalf("%s is set but %s is empty; start a worker with export %s=$(integration/connect/connect.sh start)", requireEnv, connectURLEnv, connectURLEnv)
		}
		t.Skipf("KAFKA_BROKERS is set but %s is not: no Connect worker to run Debezium in", connectURLEnv)
	}
	srv, err := pgtest.Shared()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var level string
	if err := conn.QueryRow(context.Background(), `SHOW wal_level`).Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Fatalf("the PostgreSQL server runs with wal_level=%s; CDC needs wal_level=logical, and pgtest.Shared should have started a throwaway cluster with it", level)
	}
	return w
}

// needScript fails (or skips, as need does) the test when connect.sh is
// not given, for tests that kill and restart the worker.
func (w *world) needScript(t testing.TB) {
	t.Helper()
	if w.script != "" {
		return
	}
	if os.Getenv(requireEnv) != "" {
		t.Fatalf("%s is set but %s is empty; set it to the path of integration/connect/connect.sh", requireEnv, connectScrptEnv)
	}
	t.Skipf("%s is not set: cannot kill and restart the worker", connectScrptEnv)
}

// cdc is one test's CDC pipeline: a migrated schema in CDC mode, its
// publication, a connector with its own slot, and the topic it routes to.
type cdc struct {
	t      testing.TB
	w      *world
	db     *pgtest.DB
	topic  string
	name   string // connector name, also Debezium's topic.prefix
	slot   string
	pub    string
	role   string            // the connector's database role
	config map[string]string // the registered connector configuration
	writer *producer.Writer
}

// newCDC sets up the pipeline and waits until the connector streams.
func newCDC(t testing.TB, w *world, partitions int32, opts *pgtest.Opts) *cdc {
	t.Helper()
	db := pgtest.New(t, opts)
	c := &cdc{t: t, w: w, db: db, topic: topic(t, w.broker, partitions),
		name: "cdc-" + db.Schema, slot: "slot_" + db.Schema, pub: "pub_" + db.Schema}
	ctx := context.Background()
	with := ""
	if opts != nil && opts.PartitionEventsByDay {
		with = " WITH (publish_via_partition_root = true)"
	}
	_, err := db.Pool.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{c.pub}.Sanitize()+` FOR TABLE `+db.Table("events")+with)
	require.NoError(t, err)
	// The connector logs in as a role with the grants docs/cdc.md lists,
	// and no more.
	c.role = "cdc_" + db.Schema
	role, schema := pgx.Identifier{c.role}.Sanitize(), pgx.Identifier{db.Schema}.Sanitize()
	_, err = db.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN REPLICATION;
		GRANT CONNECT ON DATABASE postgres TO `+role+`;
		GRANT USAGE ON SCHEMA `+schema+` TO `+role+`;
		GRANT SELECT ON `+db.Table("events")+` TO `+role)
	require.NoError(t, err)
	t.Cleanup(c.teardown)
	c.config = c.connectorConfig()
	// The connector's heartbeats (heartbeat.interval.ms) go to this topic;
	// the broker creates no topic by itself.
	createTopic(t, w.broker, 1, "__debezium-heartbeat."+c.name)
	c.register()
	require.NoError(t, producer.SetDispatch(ctx, db.Pool, producer.DispatchCDC, &producer.DispatchConfig{Schema: db.Schema, Slot: c.slot, Logger: quiet}))
	c.writer = producer.NewWriter(&producer.WriterConfig{Schema: db.Schema, CDC: true, Topic: c.topic})
	return c
}

// connectorConfig fills integration/connect/outbox-connector.json, the
// tested configuration, for this test's schema, slot and publication.
func (c *cdc) connectorConfig() map[string]string {
	c.t.Helper()
	_, file, _, _ := runtime.Caller(0)
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "connect", "outbox-connector.json"))
	require.NoError(c.t, err)
	u, err := url.Parse(c.db.Server.URL)
	require.NoError(c.t, err)
	pass, _ := u.User.Password()
	filled := strings.NewReplacer(
		"@NAME@", c.name, "@PGHOST@", u.Hostname(), "@PGPORT@", u.Port(), "@PGUSER@", c.role,
		"@PGPASSWORD@", pass, "@PGDATABASE@", strings.TrimPrefix(u.Path, "/"), "@SCHEMA@", c.db.Schema,
		"@SLOT@", c.slot, "@PUBLICATION@", c.pub,
	).Replace(string(raw))
	var doc struct {
		Config map[string]string `json:"config"`
	}
	require.NoError(c.t, json.Unmarshal([]byte(filled), &doc))
	return doc.Config
}

// register puts the connector's configuration to the worker and waits
// until its task runs and its slot is active. After a worker restart it
// resumes from the offsets the worker kept (standalone mode keeps offsets,
// not connector configurations).
func (c *cdc) register() {
	c.t.Helper()
	body, err := json.Marshal(c.config)
	require.NoError(c.t, err)
	status, out := c.w.rest(c.t, http.MethodPut, "/connectors/"+c.name+"/config", body)
	require.Contains(c.t, []int{http.StatusOK, http.StatusCreated}, status, "register connector %s: %s", c.name, out)
	c.waitStreaming(2 * time.Minute)
}

// waitStreaming waits until the connector and its task run and the slot
// has a reader, and fails the test with the connector's status when the
// task failed or the wait ran out.
func (c *cdc) waitStreaming(within time.Duration) {
	c.t.Helper()
	var last string
	ok := eventually.Within(within, func() bool {
		state, trace := c.state()
		last = state
		if strings.Contains(state, "FAILED") {
			c.t.Fatalf("connector %s failed: %s\n%s", c.name, state, trace)
		}
		if state != "RUNNING,RUNNING" {
			return false
		}
		var active bool
		err := c.db.Pool.QueryRow(context.Background(), `SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)`, c.slot).Scan(&active)
		return err == nil && active
	})
	if !ok {
		c.t.Fatalf("connector %s did not stream within %s (states %q)", c.name, within, last)
	}
}

// state returns the connector's and its tasks' states, comma-separated,
// and the trace of a failed task.
func (c *cdc) state() (string, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.w.connect+"/connectors/"+c.name+"/status", nil)
	resp, err := restClient.Do(req)
	if err != nil {
		return "unreachable", err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	var st struct {
		Connector struct{ State string } `json:"connector"`
		Tasks     []struct {
			State string `json:"state"`
			Trace string `json:"trace"`
		} `json:"tasks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("status %d", resp.StatusCode), ""
	}
	states := []string{st.Connector.State}
	var trace string
	for _, tk := range st.Tasks {
		states = append(states, tk.State)
		trace += tk.Trace
	}
	return strings.Join(states, ","), trace
}

// teardown deletes the connector, then drops its slot (once the walsender
// let go of it) and the publication, so that no slot of a finished test
// holds WAL back.
func (c *cdc) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if status, out := c.w.rest(c.t, http.MethodDelete, "/connectors/"+c.name, nil); status != http.StatusNoContent && status != http.StatusNotFound {
		c.t.Errorf("delete connector %s: %d %s", c.name, status, out)
	}
	var lastErr error
	if !eventually.Within(time.Minute, func() bool {
		_, lastErr = c.db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, c.slot)
		return lastErr == nil
	}) {
		c.t.Errorf("drop slot %s: %v", c.slot, lastErr)
	}
	if _, err := c.db.Pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{c.pub}.Sanitize()); err != nil {
		c.t.Errorf("drop publication %s: %v", c.pub, err)
	}
	role := pgx.Identifier{c.role}.Sanitize()
	if _, err := c.db.Pool.Exec(ctx, `DROP OWNED BY `+role+`; DROP ROLE `+role); err != nil {
		c.t.Errorf("drop role %s: %v", c.role, err)
	}
}

// restClient keeps no connection open between calls, so that none
// outlives the tests (goleak).
var restClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// rest calls the worker's REST API and returns the status and body.
func (w *world) rest(t testing.TB, method, path string, body []byte) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, w.connect+path, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := restClient.Do(req)
	require.NoError(t, err, "%s %s%s", method, w.connect, path)
	defer func() { _ = resp.Body.Close() }()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// worker runs connect.sh with the given subcommand (kill, restart) and
// returns how long it took and what it said.
func (w *world) worker(t testing.TB, sub string) (time.Duration, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "bash", w.script, sub).CombinedOutput()
	require.NoError(t, err, "connect.sh %s: %s", sub, out)
	took := time.Since(start)
	t.Logf("connect.sh %s took %s: %s", sub, took.Round(time.Millisecond), strings.TrimSpace(string(out)))
	return took, string(out)
}

// topic creates a topic, retrying while the broker is unreachable.
func topic(t testing.TB, b *kafkatest.Broker, partitions int32) string {
	t.Helper()
	return createTopic(t, b, partitions, fmt.Sprintf("cdc-%d", time.Now().UnixNano()))
}

// createTopic creates the named topic, retrying while the broker is
// unreachable.
func createTopic(t testing.TB, b *kafkatest.Broker, partitions int32, name string) string {
	t.Helper()
	adm := kadm.NewClient(b.Client(t))
	var last error
	eventually.True(t, 2*time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := adm.CreateTopic(ctx, partitions, 1, nil, name)
		if err == nil {
			err = resp.Err
		}
		if errors.Is(err, kerr.TopicAlreadyExists) {
			err = nil
		}
		last = err
		return err == nil
	}, "create topic", &last)
	return name
}

var quiet = slog.New(slog.DiscardHandler)

// testLogger logs to the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// onceFunc is sync.OnceFunc, named for the stops the tests hand out.
func onceFunc(f func()) func() { return sync.OnceFunc(f) }
