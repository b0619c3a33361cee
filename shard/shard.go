package shard

import (
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
)

// Shard is one database and schema of a fleet: a producer shard holding
// outbox events, or a consumer target holding processed keys, positions
// and dead letters.
type Shard struct {
	// Name identifies the shard in logs, metrics, the CLI and the
	// dashboard (see CheckName), unique within its list. It is a label,
	// not an address: renaming a shard changes no data.
	Name string `json:"name"`
	// Database is a pgx connection string (URL or key=value form).
	Database string `json:"database"`
	// Schema holds the outbox tables. Default outbox.DefaultSchema.
	Schema string `json:"schema,omitempty"`
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// CheckName checks a shard's or target's name: 1 to 63 letters, digits,
// '.', '_' or '-', starting with a letter or digit, so that it is safe in
// a URL path, a metric label and a log line.
func CheckName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("shard: name %.70q must be 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Validate checks the shard's name, connection string and schema, and
// fills in the default schema.
func (s *Shard) Validate() error {
	if err := CheckName(s.Name); err != nil {
		return err
	}
	if s.Database == "" {
		return fmt.Errorf("shard %s: database is empty; give a PostgreSQL connection string", s.Name)
	}
	if _, err := s.ConnConfig(); err != nil {
		return err
	}
	if s.Schema == "" {
		s.Schema = outbox.DefaultSchema
	}
	if err := tables.CheckSchema(s.Schema); err != nil {
		return fmt.Errorf("shard %s: %w", s.Name, err)
	}
	return nil
}

// ConnConfig parses the shard's connection string. The error names the
// shard but not the string, which may hold a password.
func (s *Shard) ConnConfig() (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(s.Database)
	if err != nil {
		// pgx's error can hold the string, and so a password: say less.
		return nil, fmt.Errorf("shard %s: database is not a valid pgx connection string; write it as postgres://user@host:port/dbname or host=... dbname=... (passwords belong in PGPASSWORD or ~/.pgpass)", s.Name)
	}
	return cfg, nil
}

// Server identifies the PostgreSQL database a shard lives in, whatever its
// schema: host, port, database and user. Shards with the same Server can
// share connections, such as the session a relay fleet holds its locks on.
func (s *Shard) Server() (string, error) {
	cfg, err := s.ConnConfig()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s:%d/%s@%s", cfg.Host, cfg.Port, cfg.Database, cfg.User), nil
}
