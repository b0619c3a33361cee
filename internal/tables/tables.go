package tables

import (
	"errors"
	"fmt"
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
	Members     Members
	Reads       Reads
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

// MaxIdentifierBytes is the longest identifier PostgreSQL keeps: it cuts a
// longer one to this length without an error, so that a long schema name
// silently names another schema.
const MaxIdentifierBytes = 63

// CheckSchema refuses a schema name PostgreSQL would not keep as given:
// empty, or longer than MaxIdentifierBytes.
func CheckSchema(schema string) error {
	switch {
	case schema == "":
		return errors.New("schema name is empty")
	case len(schema) > MaxIdentifierBytes:
		return fmt.Errorf("schema name %.20q… is %d bytes; PostgreSQL keeps %d and would cut it to name another schema: choose a shorter one", schema, len(schema), MaxIdentifierBytes)
	}
	return nil
}

// For returns the consumer's statements with schema written in, quoted.
func For(schema string) *Consumer {
	q := func(sql string) string { return Fill(sql, schema) }
	return &Consumer{
		Keys:        keys(q),
		Positions:   positions(q),
		Parked:      parked(q),
		DeadLetters: deadLetters(q),
		HotPath:     hotPath(q),
		Members:     members(q),
		Reads:       reads(q),
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
