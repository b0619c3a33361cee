package dedupe_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/dedupe"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
)

func TestNew(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		consumer string
		cfg      *dedupe.Config
		wantErr  string
	}{
		{"Defaults", "svc", nil, ""},
		{"EmptyConsumer", "", nil, "empty consumer name"},
		{"NegativeRetention", "svc", &dedupe.Config{Retention: -time.Hour}, "negative retention"},
		{"NegativeBatch", "svc", &dedupe.Config{PruneBatchSize: -1}, "negative prune batch size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := dedupe.New(tt.consumer, tt.cfg)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, dedupe.DefaultRetention, s.Retention())
		})
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T, consumer string, cfg *dedupe.Config) (*dedupe.Store, *pgtest.DB) {
		t.Helper()
		db := pgtest.New(t, nil)
		if cfg == nil {
			cfg = &dedupe.Config{}
		}
		cfg.Schema = db.Schema
		s, err := dedupe.New(consumer, cfg)
		require.NoError(t, err)
		return s, db
	}
	claim := func(t *testing.T, db *pgtest.DB, s *dedupe.Store, key string, commit bool) bool {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		ok, err := s.Claim(ctx, tx, key)
		require.NoError(t, err)
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
		return ok
	}

	t.Run("SecondClaimIsDuplicate", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t, "svc", nil)
		require.True(t, claim(t, db, s, "k1", true))
		require.False(t, claim(t, db, s, "k1", true))
		require.True(t, claim(t, db, s, "k2", true))
	})

	t.Run("RollbackReleasesKey", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t, "svc", nil)
		require.True(t, claim(t, db, s, "k1", false))
		require.True(t, claim(t, db, s, "k1", true))
	})

	t.Run("ConsumersAreIndependent", func(t *testing.T) {
		t.Parallel()
		s1, db := setup(t, "a", nil)
		s2, err := dedupe.New("b", &dedupe.Config{Schema: db.Schema})
		require.NoError(t, err)
		require.True(t, claim(t, db, s1, "k", true))
		require.True(t, claim(t, db, s2, "k", true))
	})

	t.Run("EmptyKeyIsAnError", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t, "svc", nil)
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = s.Claim(ctx, tx, "")
		require.ErrorIs(t, err, dedupe.ErrEmptyKey)
	})

	// Two transactions race on one key: the second blocks on the first's
	// uncommitted row, then sees the conflict and claims nothing. Neither
	// errors and exactly one applies.
	t.Run("RacingClaimersOneWinsNoneErrors", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t, "svc", nil)
		tx1, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		ok1, err := s.Claim(ctx, tx1, "k")
		require.NoError(t, err)
		require.True(t, ok1)

		type result struct {
			ok  bool
			err error
		}
		done := make(chan result, 1)
		go func() {
			tx2, err := db.Pool.Begin(ctx)
			if err != nil {
				done <- result{err: err}
				return
			}
			ok, err := s.Claim(ctx, tx2, "k")
			if err == nil {
				err = tx2.Commit(ctx)
			} else {
				_ = tx2.Rollback(ctx)
			}
			done <- result{ok, err}
		}()
		// Wait until the second claimer is blocked on the first's row lock.
		eventually.True(t, 10*time.Second, func() bool {
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, db.Schema).Scan(&n))
			return n > 0
		})
		require.NoError(t, tx1.Commit(ctx))
		r := <-done
		require.NoError(t, r.err)
		require.False(t, r.ok)
	})

	t.Run("PruneDeletesOnlyExpiredKeysInBatches", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t, "svc", &dedupe.Config{Retention: time.Hour, PruneBatchSize: 10})
		other, err := dedupe.New("other", &dedupe.Config{Schema: db.Schema, Retention: time.Hour})
		require.NoError(t, err)
		keys := make([]string, 25)
		for i := range keys {
			keys[i] = fmt.Sprintf("old-%d", i)
		}
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			for _, k := range keys {
				for _, st := range []*dedupe.Store{s, other} {
					if _, err := st.Claim(ctx, tx, k); err != nil {
						return err
					}
				}
			}
			return nil
		}))
		_, err = db.Pool.Exec(ctx, `UPDATE `+db.Table("processed_keys")+` SET processed_at = now() - interval '2 hours'`)
		require.NoError(t, err)
		require.True(t, claim(t, db, s, "fresh", true))

		n, err := s.Prune(ctx, db.Pool)
		require.NoError(t, err)
		require.EqualValues(t, 25, n)
		require.True(t, claim(t, db, s, "old-1", true), "a pruned key can be claimed again")
		require.False(t, claim(t, db, s, "fresh", true))
		require.False(t, claim(t, db, other, "old-1", true), "another consumer's keys are untouched")
	})
}
