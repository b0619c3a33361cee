package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/shard"
)

// TestFleetMigrate: migrate -fleet migrates every shard and target once,
// a second run finds them up to date, and a shard that cannot be reached
// has its row and error while the others migrate.
func TestFleetMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	schemas := []string{db.Schema + "_m1", db.Schema + "_m2", db.Schema + "_m3"}
	t.Cleanup(func() {
		for _, s := range schemas {
			_, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
		}
	})
	url := db.Server.URL
	f := shard.Fleet{
		Shards:  []shard.Shard{{Name: "s1", Database: url, Schema: schemas[0]}, {Name: "s2", Database: url, Schema: schemas[1]}},
		Targets: []shard.Shard{{Name: "s1", Database: url, Schema: schemas[0]}, {Name: "t1", Database: url, Schema: schemas[2]}},
	}
	path := writeFleet(t, f)
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"migrate", "-fleet", path}, &out), out.String())
	require.Regexp(t, `(?m)^s1\s+\S+_m1\s+applied 1 5 6 `, out.String())
	require.Regexp(t, `(?m)^t1\s+\S+_m3\s+applied 1 5 6 `, out.String())
	require.Len(t, regexp.MustCompile(`(?m)^s1\s`).FindAllString(out.String(), -1), 1, "each place once")
	for _, s := range schemas {
		require.NoError(t, outbox.CheckMigrated(ctx, db.Pool, s))
	}

	out.Reset()
	require.NoError(t, run(ctx, []string{"migrate", "-fleet", path}, &out))
	require.Regexp(t, `(?m)^s2\s+\S+_m2\s+up to date$`, out.String())

	f.Shards = append(f.Shards, shard.Shard{Name: "down", Database: refused(t)})
	out.Reset()
	err := run(ctx, []string{"migrate", "-fleet", writeFleet(t, f)}, &out)
	require.Equal(t, exitError, exitCode(err), "%v", err)
	require.EqualError(t, err, "1 of 4 shards did not migrate: down")
	require.Regexp(t, `(?m)^down\s+\S*\s+ERROR$`, out.String())
	require.Regexp(t, `(?m)^shard down: .*connection refused`, out.String())
	require.Regexp(t, `(?m)^s2\s+\S+_m2\s+up to date$`, out.String())
}

// TestFleetDashboardCmd: dashboard -fleet serves the overview of the
// fleet's shards and targets, read-only.
func TestFleetDashboardCmd(t *testing.T) {
	t.Parallel()
	a, b := pgtest.New(t, nil), pgtest.New(t, nil)
	path := writeFleet(t, shard.Fleet{
		Shards:  []shard.Shard{{Name: "alpha", Database: a.Server.URL, Schema: a.Schema}},
		Targets: []shard.Shard{{Name: "beta", Database: b.Server.URL, Schema: b.Schema}},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"dashboard", "-fleet", path, "-listen", "127.0.0.1:0"}, pw) }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	m := regexp.MustCompile(`^dashboard of a fleet of 2 shards, read-only, on (http://127\.0\.0\.1:\d+/)\n$`).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	for _, page := range []string{"", "shards/alpha/", "shards/beta/"} {
		resp, err := http.Get(m[1] + page)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", page, body)
		if page == "" {
			require.Contains(t, string(body), "alpha")
			require.Contains(t, string(body), "beta")
		}
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("dashboard -fleet did not return within 10s of cancellation")
	}
}
