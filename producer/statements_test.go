package producer

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/tables"
)

// TestNoPlaceholderSurvives: the relay's and the writer's statements have
// every placeholder filled, the schema quoted.
func TestNoPlaceholderSurvives(t *testing.T) {
	t.Parallel()
	const schema = `Odd "Schema"`
	sql := newRelaySQL(schema)
	v := reflect.ValueOf(sql)
	stmts := map[string]string{}
	for i := range v.NumField() {
		stmts["relay."+v.Type().Field(i).Name] = v.Field(i).String()
	}
	w := NewWriter(&WriterConfig{Schema: schema})
	for name, s := range map[string]string{"insertOne": w.insertOne, "insertOneWake": w.insertOneWake, "insertMany": w.insertMany, "insertManyWake": w.insertManyWake} {
		stmts["writer."+name] = s
	}
	for name, s := range stmts {
		require.NotEmpty(t, s, name)
		require.NotRegexp(t, tables.Placeholder, s, name)
		require.Contains(t, s, `"Odd ""Schema""".`, name)
	}
}
