package tables_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/internal/tables"
)

// statements returns every statement of every group of the registry for
// schema, by field path ("Producer.Relay.Claim"), walking the groups by
// reflection so that a statement added to any group is checked too.
func statements(t *testing.T, schema string) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(path string, v reflect.Value)
	walk = func(path string, v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer:
			walk(path, v.Elem())
		case reflect.Struct:
			for i := range v.NumField() {
				walk(path+"."+v.Type().Field(i).Name, v.Field(i))
			}
		case reflect.String:
			out[path] = v.String()
		default:
			t.Fatalf("%s: a registry field is a statement (string) or a group of them, not %s", path, v.Type())
		}
	}
	walk("Consumer", reflect.ValueOf(tables.For(schema)))
	walk("Producer", reflect.ValueOf(tables.ProducerFor(schema)))
	walk("Operator", reflect.ValueOf(tables.OperatorFor(schema)))
	return out
}

// partitionedOnly are the statements on what only the day-partitioned
// events layout has: its partition functions and default partition.
var partitionedOnly = map[string]bool{
	"Producer.Retention.CreatePartitions": true,
	"Producer.Retention.DropPartitions":   true,
	"Producer.Retention.PruneDefault":     true,
}

// TestNoPlaceholderSurvives: every statement of every group has each
// placeholder filled; those on the schema's tables name it quoted.
func TestNoPlaceholderSurvives(t *testing.T) {
	t.Parallel()
	all := statements(t, `Odd "Schema"`)
	require.Greater(t, len(all), 100)
	for name := range partitionedOnly {
		require.Contains(t, all, name)
	}
	for name, sql := range all {
		require.NotEmpty(t, strings.TrimSpace(sql), name)
		require.NotRegexp(t, tables.Placeholder, sql, name)
		require.NotContains(t, sql, `"Odd "Schema""`, name)
		if strings.Contains(sql, `"Odd ""Schema"""`) {
			require.Contains(t, sql, `"Odd ""Schema""".`, name)
		}
	}
}

// TestStatementsPrepare: PostgreSQL parses and plans every statement of
// every group against a migrated schema, in both layouts of the events
// table (plain and day-partitioned); the statements on what only the
// partitioned layout has, against that one (and they fail on the plain
// one, so the list excuses nothing else).
func TestStatementsPrepare(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "partitioned"}[partitioned], func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, &pgtest.Opts{PartitionEventsByDay: partitioned})
			ctx := context.Background()
			conn, err := db.Pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			n := 0
			for name, sql := range statements(t, db.Schema) {
				_, err := conn.Conn().Prepare(ctx, "", sql)
				if partitionedOnly[name] && !partitioned {
					require.Error(t, err, "%s is listed as on the partitioned layout only, yet prepares on the plain one", name)
					continue
				}
				require.NoError(t, err, name)
				n++
			}
			require.Greater(t, n, 100)
		})
	}
}
