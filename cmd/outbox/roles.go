package main

import (
	"fmt"
	"io"

	"github.com/d419a114/outbox"
)

// printRoles is outbox sql -roles: the least-privilege group roles of
// schema (outbox.RolesSQL), for the schema's owner to run after migrate.
func printRoles(out io.Writer, schema string) error {
	sql, err := outbox.RolesSQL(schema)
	if err != nil {
		return withCode(exitUsage, err)
	}
	_, err = fmt.Fprint(out, sql)
	return err
}
