package shard_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/shard"
)

func TestParseFillsDefaultsAndFinds(t *testing.T) {
	f, err := shard.Parse(strings.NewReader(`{
		"shards": [{"name": "eu-1", "database": "postgres://relay@db1:5433/pay"},
		           {"name": "t-1", "database": "host=db2 dbname=app user=u", "schema": "tenant_1"}],
		"targets": [{"name": "ledger", "database": "postgres://l@db3/ledger"}]}`))
	require.NoError(t, err)
	require.Equal(t, "outbox", f.Shards[0].Schema)
	s, ok := f.Shard("t-1")
	require.True(t, ok)
	require.Equal(t, "tenant_1", s.Schema)
	_, ok = f.Shard("ledger")
	require.False(t, ok, "a target is not a shard")
	tg, ok := f.Target("ledger")
	require.True(t, ok)
	server, err := tg.Server()
	require.NoError(t, err)
	require.Equal(t, "db3:5432/ledger@l", server)
}

func TestParseRefuses(t *testing.T) {
	for name, tc := range map[string]struct{ json, want string }{
		"unknown field":     {`{"shards": [{"name": "a", "database": "postgres://h/d", "shema": "x"}]}`, `unknown field "shema"`},
		"empty":             {`{}`, "names no shards"},
		"dots":              {`{"shards": [{"name": "..", "database": "postgres://h/d"}]}`, "must be 1 to 63"},
		"bad name":          {`{"shards": [{"name": "a b", "database": "postgres://h/d"}]}`, "must be 1 to 63"},
		"long name":         {`{"shards": [{"name": "` + strings.Repeat("a", 64) + `", "database": "postgres://h/d"}]}`, "must be 1 to 63"},
		"no database":       {`{"shards": [{"name": "a"}]}`, "database is empty"},
		"duplicate name":    {`{"shards": [{"name": "a", "database": "postgres://h/d"}, {"name": "a", "database": "postgres://h/e"}]}`, "used twice"},
		"same place":        {`{"targets": [{"name": "a", "database": "postgres://u@h/d"}, {"name": "b", "database": "host=h dbname=d user=u"}]}`, "same database and schema"},
		"long schema":       {`{"shards": [{"name": "a", "database": "postgres://h/d", "schema": "` + strings.Repeat("s", 64) + `"}]}`, "choose a shorter one"},
		"two values":        {`{"shards": []} {}`, "more than one JSON value"},
		"not json":          {`shards: []`, "not a fleet"},
		"password redacted": {`{"shards": [{"name": "a", "database": "postgres://u:s3cret@h:notaport/d"}]}`, "not a valid pgx connection string"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := shard.Parse(strings.NewReader(tc.json))
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "s3cret")
		})
	}
}

func TestSameNameInShardsAndTargetsIsAllowed(t *testing.T) {
	f := shard.Fleet{
		Shards:  []shard.Shard{{Name: "a", Database: "postgres://h/d"}},
		Targets: []shard.Shard{{Name: "a", Database: "postgres://h/d"}},
	}
	require.NoError(t, f.Validate(), "a database can be a shard and a target at once")
}

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"shards": [{"name": "a", "database": "postgres://h/d"}]}`), 0o600))
	f, err := shard.Load(path)
	require.NoError(t, err)
	require.Len(t, f.Shards, 1)
	_, err = shard.Load(filepath.Join(t.TempDir(), "missing.json"))
	require.ErrorContains(t, err, "open fleet file")
	require.NoError(t, os.WriteFile(path, []byte(strings.Repeat(" ", 16<<20+1)), 0o600))
	_, err = shard.Load(path)
	require.ErrorContains(t, err, "longer than")
}
