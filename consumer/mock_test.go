package consumer_test

// Mocks of DB (and Handler), for database faults that a real server
// cannot be made to produce on cue.
//go:generate go run go.uber.org/mock/mockgen@v0.6.0 -typed -source=processor.go -destination=processor_mock_test.go -package=consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/mock/gomock"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
)

var errConnRefused = errors.New("dial tcp: connection refused")

// flakyDB is the test's pool whose first failures calls to Acquire or
// Begin fail, as a database that is down and comes back.
func flakyDB(t *testing.T, db *pgtest.DB, failures int64) *MockDB {
	t.Helper()
	m := NewMockDB(gomock.NewController(t))
	var calls atomic.Int64
	down := func() bool { return calls.Add(1) <= failures }
	m.EXPECT().Acquire(gomock.Any()).DoAndReturn(func(ctx context.Context) (*pgxpool.Conn, error) {
		if down() {
			return nil, errConnRefused
		}
		return db.Pool.Acquire(ctx)
	}).AnyTimes()
	m.EXPECT().Begin(gomock.Any()).DoAndReturn(func(ctx context.Context) (pgx.Tx, error) {
		if down() {
			return nil, errConnRefused
		}
		return db.Pool.Begin(ctx)
	}).AnyTimes()
	m.EXPECT().Exec(gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(db.Pool.Exec).AnyTimes()
	m.EXPECT().Query(gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(db.Pool.Query).AnyTimes()
	m.EXPECT().QueryRow(gomock.Any(), gomock.Any(), gomock.Any()).DoAndReturn(db.Pool.QueryRow).AnyTimes()
	return m
}

// A database failure is not the record's fault: it is retried, and it is
// never dead-lettered; when the database stays away, the record is handed
// back undone.
func TestDatabaseFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("BeginFailsThenRecovers", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		p, err := consumer.Handle(flakyDB(t, db, 2), "svc", e, fastConfig(db, 1))
		require.NoError(t, err)
		r := rec("o", 1, "k")
		r.Topic, r.Offset = "orders", nextOffset.Add(1)
		res, err := p.Process(ctx, r)
		require.NoError(t, err)
		require.Equal(t, consumer.Applied, res.Outcome)
		require.Equal(t, 1, res.Attempts, "the handler ran once")
		rows, _ := e.count(t)
		require.Equal(t, 1, rows)
	})

	t.Run("DatabaseDownHandsTheRecordBack", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		p, err := consumer.Handle(flakyDB(t, db, 1<<40), "svc", e, fastConfig(db, 1))
		require.NoError(t, err)
		r := rec("o", 1, "k")
		r.Topic, r.Offset = "orders", nextOffset.Add(1)
		_, err = p.Process(ctx, r)
		require.ErrorIs(t, err, errConnRefused)
		_, err = p.ProcessBatch(ctx, []*kgo.Record{r, rec("o", 2, "k2")})
		require.ErrorIs(t, err, errConnRefused)
		var letters int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("dead_letters")).Scan(&letters))
		require.Zero(t, letters)
	})

	// The handler's connection dies under it (the server restarted, the
	// network failed): not the record's fault, so no dead letter.
	t.Run("LostConnectionIsNotTheRecordsFault", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		})
		// One attempt only: a lost connection counted as the record's try
		// would dead-letter it at once.
		cfg := fastConfig(db, 1)
		cfg.MaxAttempts = 1
		p, err := consumer.Handle(db.Pool, "svc", h, cfg)
		require.NoError(t, err)
		r := rec("o", 1, "k")
		r.Topic, r.Offset = "orders", nextOffset.Add(1)
		_, err = p.Process(ctx, r)
		require.Error(t, err)
		r2 := rec("o", 2, "k2")
		r2.Topic, r2.Offset = "orders", nextOffset.Add(1)
		_, err = p.ProcessBatch(ctx, []*kgo.Record{r, r2})
		require.Error(t, err, "in a batch too")
		var letters int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("dead_letters")).Scan(&letters))
		require.Zero(t, letters)
	})

	for _, mode := range runnerModes {
		t.Run("RunnerWaitsForTheDatabase"+mode.name, func(t *testing.T) {
			t.Parallel()
			b := newGroupBundle(t, 2)
			b.produce(t, stream(4, 40)...)
			cl := b.client(t, b.group)
			c, err := consumer.New(flakyDB(t, b.db, 12), cl, "svc", mode.handler(b.effects), mode.config(b.db))
			require.NoError(t, err)
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(runCtx) }()
			eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == 40 })
			stop()
			require.NoError(t, <-done)
			rows, distinct := b.effects.count(t)
			require.Equal(t, 40, rows)
			require.Equal(t, 40, distinct)
			var letters int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.db.Table("dead_letters")).Scan(&letters))
			require.Zero(t, letters)
		})
	}
}
