package tables

import (
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// placeholder is where a statement names its schema.
const placeholder = "{schema}"

// Consumer holds the statements of the consumer's tables in one schema.
type Consumer struct {
	Keys        Keys
	Positions   Positions
	Parked      Parked
	DeadLetters DeadLetters
	HotPath     HotPath
}

// Fill is how every statement of the SDK gets its schema: it writes
// schema, quoted, for each {schema} in sql, and each further pair of more (a
// placeholder such as "{table}", then its text) likewise. The schema is
// configuration, quoted by pgx.Identifier; no other input reaches SQL text.
func Fill(sql, schema string, more ...string) string {
	return strings.NewReplacer(append([]string{placeholder, pgx.Identifier{schema}.Sanitize()}, more...)...).Replace(sql)
}

// Placeholder matches a placeholder Fill was not given, for the tests that
// make sure none survives.
var Placeholder = regexp.MustCompile(`\{[a-z_]+\}`)

// For returns the statements with schema written in, quoted.
func For(schema string) *Consumer {
	q := func(sql string) string { return Fill(sql, schema) }
	return &Consumer{
		Keys:        keys(q),
		Positions:   positions(q),
		Parked:      parked(q),
		DeadLetters: deadLetters(q),
		HotPath:     hotPath(q),
	}
}

// Filter is the argument of a statement's optional filter (written
// "$n::text IS NULL OR column = $n"): NULL, which matches every row, for an
// empty value.
func Filter(v string) *string {
	if v == "" {
		return nil
	}
	return &v
}
