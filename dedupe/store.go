package dedupe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
)

// DefaultRetention is how long keys are kept unless Config says otherwise.
const DefaultRetention = 7 * 24 * time.Hour

// Config tunes a Store. The zero value is valid.
type Config struct {
	// Schema holds the processed_keys table. Default outbox.DefaultSchema.
	Schema string
	// Retention is how long a key is kept after it was claimed. It must
	// outlast every way a record can be delivered again. Default 7 days.
	Retention time.Duration
	// PruneBatchSize bounds the rows one DELETE of Prune removes, so that
	// pruning never holds long locks or builds one huge transaction.
	// Default 5000.
	PruneBatchSize int
}

// Store claims keys for one consumer. It is safe for concurrent use.
type Store struct {
	consumer  string
	retention time.Duration
	batch     int
	sql       tables.Keys
}

// New returns the store of the named consumer. Consumers with different
// names deduplicate independently.
func New(consumer string, cfg *Config) (*Store, error) {
	if consumer == "" {
		return nil, errors.New("dedupe: empty consumer name; name the consumer, for example after its service")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	schema := cfg.Schema
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	if err := tables.CheckSchema(schema); err != nil {
		return nil, fmt.Errorf("dedupe: %w", err)
	}
	retention := cfg.Retention
	if retention == 0 {
		retention = DefaultRetention
	}
	if retention < 0 {
		return nil, fmt.Errorf("dedupe: negative retention %s", retention)
	}
	batch := cfg.PruneBatchSize
	if batch == 0 {
		batch = 5000
	}
	if batch < 0 {
		return nil, fmt.Errorf("dedupe: negative prune batch size %d", batch)
	}
	return &Store{
		consumer:  consumer,
		retention: retention,
		batch:     batch,
		sql:       tables.For(schema).Keys,
	}, nil
}

// Consumer returns the consumer name the store claims for.
func (s *Store) Consumer() string { return s.consumer }

// Retention returns the configured retention window.
func (s *Store) Retention() time.Duration { return s.retention }

// Claim claims key inside tx and reports whether this transaction got it.
// False means the key was claimed before (by a committed transaction, or by
// a concurrent one that then committed): the caller must skip the effect. A
// concurrent claimer of the same key blocks until the first one ends.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, key string) (bool, error) {
	if key == "" {
		return false, ErrEmptyKey
	}
	tag, err := tx.Exec(ctx, s.sql.Claim, s.consumer, key)
	if err != nil {
		return false, fmt.Errorf("dedupe: claim key: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Claimed reports whether key is claimed, by a committed transaction or by
// tx itself.
func (s *Store) Claimed(ctx context.Context, tx pgx.Tx, key string) (bool, error) {
	var ok bool
	if err := tx.QueryRow(ctx, s.sql.Claimed, s.consumer, key).Scan(&ok); err != nil {
		return false, fmt.Errorf("dedupe: look up key: %w", err)
	}
	return ok, nil
}

// Release removes the claim of key inside tx, so that the key can be
// claimed again: for a record that was taken into custody (parked) and then
// given up on, so that a later replay is not mistaken for a duplicate.
func (s *Store) Release(ctx context.Context, tx pgx.Tx, key string) error {
	if _, err := tx.Exec(ctx, s.sql.Release, s.consumer, key); err != nil {
		return fmt.Errorf("dedupe: release key: %w", err)
	}
	return nil
}

// Prune deletes this consumer's keys claimed longer ago than the retention
// window, in batches of PruneBatchSize, each its own statement, until none
// is left or ctx ends. It returns how many keys it deleted. Run it
// periodically on the primary.
func (s *Store) Prune(ctx context.Context, db outbox.DB) (int64, error) {
	cutoff := time.Now().Add(-s.retention)
	var total int64
	for {
		tag, err := db.Exec(ctx, s.sql.Prune, s.consumer, cutoff, s.batch)
		if err != nil {
			return total, fmt.Errorf("dedupe: prune keys: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(s.batch) {
			return total, nil
		}
	}
}
