package tables_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/internal/tables"
)

// statements returns every statement of c by its field path.
func statements(c *tables.Consumer) map[string]string {
	out := map[string]string{}
	v := reflect.ValueOf(*c)
	for i := range v.NumField() {
		group := v.Field(i)
		for j := range group.NumField() {
			out[v.Type().Field(i).Name+"."+group.Type().Field(j).Name] = group.Field(j).String()
		}
	}
	return out
}

// TestNoPlaceholderSurvives: For writes the schema, quoted, into every
// statement, and leaves no placeholder behind.
func TestNoPlaceholderSurvives(t *testing.T) {
	t.Parallel()
	all := statements(tables.For(`Odd "Schema"`))
	require.NotEmpty(t, all)
	for name, sql := range all {
		require.NotEmpty(t, sql, name)
		require.NotRegexp(t, tables.Placeholder, sql, name)
		require.Contains(t, sql, `"Odd ""Schema""".`, name)
	}
}

// TestStatementsPrepare: PostgreSQL parses and plans every statement
// against the migrated schema.
func TestStatementsPrepare(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, nil)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for name, sql := range statements(tables.For(db.Schema)) {
		_, err := conn.Conn().Prepare(ctx, "", sql)
		require.NoError(t, err, name)
	}
}
