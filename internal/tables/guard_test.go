package tables_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// statementStart is how an SQL statement begins (case-insensitive, after
// leading space): specific enough that Go identifiers and prose ("create
// topic: %w", a flag named listen) do not match, since a literal is then
// a statement only if PostgreSQL could run it.
var statementStart = regexp.MustCompile(`(?is)^\s*(` +
	`SELECT\b|INSERT\s+INTO\b|UPDATE\s+\S+(\s+(AS\s+)?\w+)?\s+SET\b|DELETE\s+FROM\b|` +
	`WITH\s+(RECURSIVE\s+)?\w+(\s*\([^)]*\))?\s+AS\b|` +
	`(CREATE|ALTER|DROP)\s+(OR\s+REPLACE\s+|UNIQUE\s+|TEMP\w*\s+)?(TABLE|SCHEMA|INDEX|VIEW|FUNCTION|PROCEDURE|TRIGGER|PUBLICATION|ROLE|SEQUENCE|TYPE|EXTENSION|OWNED|DEFAULT)\b|` +
	`LOCK\s+(TABLE\s+)?\S|(UN)?LISTEN\s|NOTIFY\s|TRUNCATE\s|GRANT\s|REVOKE\s|COPY\s|DO\s+\$|CALL\s+\w|` +
	`SET\s+((LOCAL|SESSION)\s+)?\w+\s*(=|TO\b)|SHOW\s+\w+\s*$|DISCARD\s+(ALL|PLANS|SEQUENCES|TEMP)|` +
	`(BEGIN|START\s+TRANSACTION|COMMIT|END|ROLLBACK|ABORT)\s*(;\s*)?$|ROLLBACK\s+TO\b|(RELEASE\s+)?SAVEPOINT\s|` +
	`EXPLAIN\s|VACUUM\b|ANALYZE\s|REFRESH\s+MATERIALIZED)`)

// fragment is SQL that is not a whole statement but part of one: a
// placeholder Fill fills, or a table name formatted in by hand (upper
// case, as this repository writes SQL, so that prose such as "changed
// from %s" is not taken for it).
var fragment = regexp.MustCompile(`\{schema\}\.|\b(FROM|JOIN|INTO|UPDATE)\s+%[sqv]`)

// allowed are the places outside the registry where SQL text may be
// written, each with why. A path ending in "/" covers a directory; an
// entry with a statement covers only literals that begin with it.
var allowed = []struct{ path, statement, why string }{
	{"internal/tables/", "", "the registry itself"},
	{"migrate.go", "", "Migrate's bookkeeping around the embedded migrations (advisory lock, CREATE SCHEMA, schema_versions, search_path): it runs before the registry's tables exist"},
	{"consumer/judge.go", "SELECT 1", "probes whether the database answers; names no table"},
	{"internal/pgpipeline/", "", "the pipelined transaction sends what pgx.Tx would (begin, commit, rollback, rollback to savepoint) and reads the session's pg_backend_pid(); names no table"},
	{"consumer/sessions.go", "SELECT pg_terminate_backend(", "ends the server sessions of abandoned transactions; names no table"},
	{"consumertest/", "", "the test kit's own log table in its throwaway schema, and its injected serialization failure"},
	{"examples/", "", "the examples' own business tables"},
	{"integration/", "", "the soak harness's own tables and its fault of killing sessions"},
	{"internal/pgtest/", "", "test harness: drops the throwaway schemas, reads wal_level"},
	{"internal/pgbouncer/", "", "test harness: probes the pooler it started"},
	{"internal/pgsession/", "", "test harness: reads the server pid behind a pooler"},
}

// TestNoSQLOutsideRegistry: no Go file of the repository but the registry
// and the allowed places writes SQL text, whole or in pieces, so every
// statement the SDK runs is one the tests above check.
func TestNoSQLOutsideRegistry(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	used := make([]bool, len(allowed))
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel := filepath.ToSlash(strings.TrimPrefix(path, root+string(filepath.Separator)))
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			text, err := strconv.Unquote(lit.Value)
			if err != nil || !statementStart.MatchString(text) && !fragment.MatchString(text) {
				return true
			}
			for i, a := range allowed {
				if (rel == a.path || strings.HasSuffix(a.path, "/") && strings.HasPrefix(rel, a.path)) &&
					strings.HasPrefix(strings.TrimSpace(text), a.statement) {
					used[i] = true
					return true
				}
			}
			first, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
			t.Errorf("%s: SQL written outside internal/tables: %q; add it to a group of the registry there", fset.Position(lit.Pos()), first)
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 100, "the walk found too few files: is the root %s the repository?", root)
	for i, a := range allowed {
		require.True(t, used[i], "allowed entry %s %q matches nothing any more; remove it", a.path, a.statement)
	}
}
