package outbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/d419a114/outbox/internal/tables"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// DefaultSchema is the PostgreSQL schema that holds the SDK's tables unless a
// Config says otherwise.
const DefaultSchema = "outbox"

// baselineName is the file that holds versions 1 to 4 in one, and
// baselineCovers the last version it stands for.
const (
	baselineName   = "0001_baseline.sql"
	baselineCovers = 4
)

// partitionedLayout is the optional file that Migrate runs before version 1
// when [MigrateConfig.PartitionEventsByDay] is set.
const partitionedLayout = "partitioned_events.sql"

// Migrations returns the SQL migration files, for users who apply them with
// their own tool (goose, atlas, golang-migrate). Files named NNNN_name.sql are
// versions to apply in order; partitioned_events.sql is the optional
// day-partitioned events table, applied before 0001 when wanted. The files use
// unqualified names: run them with search_path set to the target schema.
// 0001_baseline.sql replaced the files 0001 to 0004 of earlier builds: a
// schema they migrated is at version 4, and a tool that tracks versions by
// number skips the baseline there, as Migrate does.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embedded directory is fixed at build time
	}
	return sub
}

// migration is one numbered migration file: its version (the number the
// name starts with), its file name and its content.
type migration struct {
	Version int
	Name    string
	SQL     string
}

// migrationList returns the numbered migrations in the order they apply.
func migrationList() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var list []migration
	for _, e := range entries {
		name := e.Name()
		prefix, _, ok := strings.Cut(name, "_")
		version, err := strconv.Atoi(prefix)
		if !ok || err != nil {
			continue // not a numbered version, e.g. the optional layout
		}
		body, err := migrationFiles.ReadFile(path.Join("migrations", name))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		list = append(list, migration{Version: version, Name: name, SQL: string(body)})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Version < list[j].Version })
	return list, nil
}

// MigrateConfig tunes Migrate. The zero value is valid.
type MigrateConfig struct {
	// Schema is where the tables go; it is created if missing.
	// Default DefaultSchema ("outbox").
	Schema string
	// PartitionEventsByDay creates the events table partitioned by day, so
	// that retention drops partitions instead of deleting rows. It applies
	// only when the schema is first migrated; it cannot convert an existing
	// table. Default false.
	PartitionEventsByDay bool
	// Logger receives one line per applied migration. Default slog.Default().
	Logger *slog.Logger
}

// migrateLockClass namespaces Migrate's advisory lock; the second key is the
// hash of the schema name, so migrations of different schemas do not wait for
// each other.
const migrateLockClass = 0x6f75 // "ou"

// Migrate brings schema up to the newest version in one transaction. It is
// safe to run on every start-up and from several processes at once: an
// advisory lock serialises concurrent runs and the versions table makes a
// second run a no-op. It returns the versions it applied.
func Migrate(ctx context.Context, db DB, cfg *MigrateConfig) ([]int, error) {
	if cfg == nil {
		cfg = &MigrateConfig{}
	}
	schema := cfg.Schema
	if schema == "" {
		schema = DefaultSchema
	}
	if err := tables.CheckSchema(schema); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	list, err := migrationList()
	if err != nil {
		return nil, err
	}
	quoted := pgx.Identifier{schema}.Sanitize()

	// A pgx.Tx given as db runs the migrations in a savepoint of its own
	// transaction.
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// The lock comes before CREATE SCHEMA IF NOT EXISTS: two sessions
	// creating the same schema at once would otherwise race on the catalog's
	// unique index and one would fail.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, migrateLockClass, schema); err != nil {
		return nil, fmt.Errorf("migrate: take advisory lock: %w", err)
	}
	setup := tables.Fill(`CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.schema_versions (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`, schema)
	if _, err := tx.Exec(ctx, setup); err != nil {
		return nil, fmt.Errorf("migrate: create schema %s: %w", quoted, err)
	}
	rows, err := tx.Query(ctx, tables.Fill(`SELECT version, name FROM {schema}.schema_versions`, schema))
	if err != nil {
		return nil, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	applied := map[int]string{}
	var (
		version int
		name    string
	)
	if _, err := pgx.ForEachRow(rows, []any{&version, &name}, func() error {
		applied[version] = name
		return nil
	}); err != nil {
		return nil, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	if err := checkBaseline(quoted, applied); err != nil {
		return nil, err
	}
	// SET LOCAL ends with the transaction, so the caller's connection keeps
	// its own search_path.
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, quoted); err != nil {
		return nil, fmt.Errorf("migrate: set search_path: %w", err)
	}
	var (
		done  []int
		names = map[int]string{}
	)
	for _, m := range list {
		if _, ok := applied[m.Version]; ok {
			continue
		}
		if m.Version == 1 && cfg.PartitionEventsByDay {
			body, err := migrationFiles.ReadFile(path.Join("migrations", partitionedLayout))
			if err != nil {
				return nil, fmt.Errorf("migrate: read %s: %w", partitionedLayout, err)
			}
			if _, err := tx.Exec(ctx, string(body)); err != nil {
				return nil, fmt.Errorf("migrate: apply %s: %w", partitionedLayout, err)
			}
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, fmt.Errorf("migrate: apply %s: %w", m.Name, err)
		}
		if _, err := tx.Exec(ctx, tables.Fill(`INSERT INTO {schema}.schema_versions (version, name) VALUES ($1, $2)`, schema), m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("migrate: record %s: %w", m.Name, err)
		}
		done = append(done, m.Version)
		names[m.Version] = m.Name
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrate: commit: %w", err)
	}
	for _, v := range done {
		logger.InfoContext(ctx, "outbox: applied migration", slog.String("schema", schema), slog.Int("version", v), slog.String("file", names[v]))
	}
	return done, nil
}

// checkBaseline makes sure a schema migrated by the files the baseline
// replaced went all the way: such a schema has version 1 under another name,
// and only with versions 2 to 4 as well is it at the baseline's state. Until
// then no file of this build can bring it there.
func checkBaseline(quoted string, applied map[int]string) error {
	first, ok := applied[1]
	if !ok || first == baselineName {
		return nil
	}
	for v := 2; v <= baselineCovers; v++ {
		if _, ok := applied[v]; !ok {
			return fmt.Errorf("migrate: schema %s stopped at version %d of the migration files that %s replaced; finish it to version %d with the build that started it (any build before the baseline), then run this one",
				quoted, v-1, baselineName, baselineCovers)
		}
	}
	return nil
}

// ErrNotMigrated is wrapped by CheckMigrated's error when the schema lacks
// the SDK's tables or is older than the SDK.
var ErrNotMigrated = errors.New("outbox: schema not migrated")

// CheckMigrated fails, wrapping ErrNotMigrated, when schema ("" means
// DefaultSchema) in db has none of the SDK's tables or is at a version
// older than the newest migration of this SDK, with an error that says to
// run Migrate (or outbox migrate) there. Components that start against a
// database check it first: a missing table would otherwise fail every
// statement with SQLSTATE 42P01, which says nothing of the fix.
func CheckMigrated(ctx context.Context, db DB, schema string) error {
	if schema == "" {
		schema = DefaultSchema
	}
	list, err := migrationList()
	if err != nil {
		return err
	}
	want := list[len(list)-1].Version
	fix := fmt.Sprintf("run outbox.Migrate(ctx, db, &outbox.MigrateConfig{Schema: %q}), or `outbox migrate -schema %s`, against this database", schema, schema)
	var have int
	err = db.QueryRow(ctx, tables.Fill(`SELECT coalesce(max(version), 0) FROM {schema}.schema_versions`, schema)).Scan(&have)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000"):
		return fmt.Errorf("%w: schema %q has no outbox tables in this database: %s", ErrNotMigrated, schema, fix)
	case err != nil:
		return fmt.Errorf("outbox: read the version of schema %q: %w", schema, err)
	case have < want:
		return fmt.Errorf("%w: schema %q is at version %d and this SDK needs %d: %s", ErrNotMigrated, schema, have, want, fix)
	}
	return nil
}
