package outbox

import (
	_ "embed"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed roles.sql
var rolesSQL string

// roleSuffixes are the components that get a role, named schema + "_" +
// component.
var roleSuffixes = []string{"writer", "relay", "consumer", "operator", "dashboard"}

// maxIdentifier is PostgreSQL's NAMEDATALEN - 1: longer names are cut.
const maxIdentifier = 63

// RolesSQL returns the SQL that creates the least-privilege group roles of
// schema ("" means DefaultSchema) and grants them what each component
// needs: S_writer (producer.Writer), S_relay (producer.Relay), S_consumer
// (consumer.Consumer), S_operator (the outbox command line and
// operator.Store) and S_dashboard (package dashboard, read-only), where S
// is the schema's name. The roles are NOLOGIN: grant each to the login
// role its component runs as. Run the SQL as the schema's owner after
// Migrate; it is idempotent. The file's comments say what each grant is
// for and what the partitioned layout needs.
//
// It refuses a schema whose role names would exceed PostgreSQL's 63
// bytes, or that holds a NUL byte or a $.
func RolesSQL(schema string) (string, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if strings.ContainsAny(schema, "\x00$") {
		return "", fmt.Errorf("outbox: roles: schema name %q holds a NUL byte or a $, which the roles script cannot quote inside its DO block; rename the schema", schema)
	}
	if n := len(schema) + len("_dashboard"); n > maxIdentifier {
		return "", fmt.Errorf("outbox: roles: schema name %q is %d bytes; the role %s_dashboard would be %d bytes, above PostgreSQL's %d; use a schema name of at most %d bytes",
			schema, len(schema), schema, n, maxIdentifier, maxIdentifier-len("_dashboard"))
	}
	pairs := []string{"{schema}", pgx.Identifier{schema}.Sanitize()}
	for _, s := range roleSuffixes {
		name := schema + "_" + s
		pairs = append(pairs,
			"{"+s+"}", pgx.Identifier{name}.Sanitize(),
			"{"+s+"_lit}", quoteLiteral(name))
	}
	return strings.NewReplacer(pairs...).Replace(rolesSQL), nil
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings
// on, the default since PostgreSQL 9.1).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
