package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
)

// statementTimeout is a handler step that always runs into the
// transaction's statement_timeout: SQLSTATE 57014 from the handler's own
// statement, while the database serves everything else.
func statementTimeout(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = '10ms'`); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `SELECT pg_sleep(5)`)
	if err == nil {
		return errors.New("test: pg_sleep outlived statement_timeout")
	}
	return err
}

// TestNoRecordRetriedForever: a failure with a SQLSTATE an outage also
// causes (a statement timeout, a lock timeout, a serialization failure)
// is the record's fault when the database serves other work, so it counts
// toward MaxAttempts and ends as a dead letter; during an outage nothing
// counts and nothing is dead-lettered; a pooler's lost statement never
// counts.
func TestNoRecordRetriedForever(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, md := range modes {
		t.Run("StatementTimeoutInTheHandler"+md.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, nil)
			e := newEffects(t, db)
			var h consumer.Handler = timesOut{e}
			if md.batchHandler {
				h = batchTimesOut{timesOut{e}}
			}
			p, err := consumer.Handle(db.Pool, "svc", h, fastConfig(db, md.batch))
			require.NoError(t, err)
			res := processAll(t, p, md.batch, rec("sick", 1, "s1"), rec("well", 1, "w1"))
			require.NoError(t, res[1].Err)
			require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Applied}, outcomes(res))
			var pe *pgconn.PgError
			require.ErrorAs(t, res[0].Err, &pe)
			require.Equal(t, "57014", pe.Code)
			require.Equal(t, 3, res[0].Attempts, "every try counted: MaxAttempts 3")
		})
	}

	t.Run("LockTimeoutInTheHandler", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '20ms'`); err != nil {
				return err
			}
			return e.Handle(ctx, tx, m)
		})
		c := fastConfig(db, 1)
		c.ContentionSpan = 100 * time.Millisecond // over while the lock is held
		p, err := consumer.Handle(db.Pool, "svc", h, c)
		require.NoError(t, err)
		lock, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = lock.Rollback(ctx) }()
		_, err = lock.Exec(ctx, `LOCK TABLE `+e.table+` IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		res, err := p.Process(ctx, placed(t, "o", 1, "k1"))
		require.NoError(t, err)
		require.Equal(t, consumer.DeadLettered, res.Outcome, "the database answered every probe: the lock is the record's problem")
		var pe *pgconn.PgError
		require.ErrorAs(t, res.Err, &pe)
		require.Equal(t, "55P03", pe.Code)
	})

	// A healthy record that waits on a lock longer than its lock_timeout
	// for more than MaxAttempts tries is not poison: within
	// ContentionSpan it is tried again, and applies once the lock is gone.
	t.Run("LockWaitWithinContentionSpanIsRiddenOut", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		lock, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = lock.Rollback(ctx) }()
		_, err = lock.Exec(ctx, `LOCK TABLE `+e.table+` IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		var runs atomic.Int32
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if runs.Add(1) == 6 { // twice MaxAttempts: the lock's holder is done
				require.NoError(t, lock.Rollback(ctx))
			}
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '20ms'`); err != nil {
				return err
			}
			return e.Handle(ctx, tx, m)
		})
		c := fastConfig(db, 1)
		c.ContentionSpan = time.Hour
		p, err := consumer.Handle(db.Pool, "svc", h, c)
		require.NoError(t, err)
		res, err := p.Process(ctx, placed(t, "o", 1, "k1"))
		require.NoError(t, err)
		require.Equal(t, consumer.Applied, res.Outcome, "a lock wait the next try clears is not poison")
		require.Equal(t, 6, res.Attempts)
	})

	t.Run("HandlerTimeoutCancelledByTheServer", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		// pgx cancels a statement whose context ends with a cancel
		// request when so configured: the server answers 57014 and the
		// connection stays open.
		cfg := db.Pool.Config()
		cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 5 * time.Second}
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer pool.Close()
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `SELECT pg_sleep(5)`)
			return err
		})
		c := fastConfig(db, 1)
		c.HandlerTimeout = 20 * time.Millisecond
		p, err := consumer.Handle(pool, "svc", h, c)
		require.NoError(t, err)
		res, err := p.Process(ctx, placed(t, "o", 1, "k1"))
		require.NoError(t, err)
		require.Equal(t, consumer.DeadLettered, res.Outcome)
		var te *consumer.HandlerTimeoutError
		require.ErrorAs(t, res.Err, &te)
		var pe *pgconn.PgError
		require.ErrorAs(t, res.Err, &pe)
		require.Equal(t, "57014", pe.Code)
		require.Equal(t, 3, res.Attempts)
	})

	for _, md := range modes {
		t.Run("ContentionThatEndsIsRetried"+md.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, nil)
			e := newEffects(t, db)
			var fails atomic.Int32
			fails.Store(2) // below MaxAttempts 3
			e.reject = func(m *consumer.Message) error {
				if m.AggregateID == "o" && fails.Add(-1) >= 0 {
					return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
				}
				return nil
			}
			p, err := consumer.Handle(db.Pool, "svc", md.handler(e), fastConfig(db, md.batch))
			require.NoError(t, err)
			res := processAll(t, p, md.batch, placed(t, "o", 1, "k1"), placed(t, "p", 1, "p1"))
			require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied}, outcomes(res))
		})
	}

	t.Run("OutageCountsNothing", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		down := &outage{DB: db.Pool}
		// The server goes down while the handler runs: its statement
		// fails, and so does everything after it.
		var crash atomic.Bool
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if crash.Load() {
				down.on.Store(true)
				return &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}
			}
			return e.Handle(ctx, tx, m)
		})
		var logs lockedBuffer
		c := fastConfig(db, 1)
		c.Logger = logs.logger()
		p, err := consumer.Handle(down, "svc", h, c)
		require.NoError(t, err)
		r := placed(t, "o", 1, "k1")
		crash.Store(true)
		for range 3 {
			down.on.Store(false)
			_, err = p.Process(ctx, r)
			var pe *pgconn.PgError
			require.ErrorAs(t, err, &pe, "handed back undone")
		}
		down.on.Store(false)
		crash.Store(false)
		letters, err := lettersOf(ctx, p, nil)
		require.NoError(t, err)
		require.Empty(t, letters, "nothing is dead-lettered while the database does not answer")
		require.Contains(t, logs.String(), "database not answering")
		res, err := p.Process(ctx, r)
		require.NoError(t, err)
		require.Equal(t, consumer.Applied, res.Outcome)
	})

	t.Run("PoolerErrorsCountNothing", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		var fails atomic.Int32
		fails.Store(10)
		e.reject = func(m *consumer.Message) error {
			if fails.Add(-1) >= 0 {
				return &pgconn.PgError{Code: "26000", Message: `prepared statement "stmtcache_1" does not exist`}
			}
			return nil
		}
		var logs lockedBuffer
		c := fastConfig(db, 1)
		c.Logger = logs.logger()
		p, err := consumer.Handle(db.Pool, "svc", e, c)
		require.NoError(t, err)
		// The pooler loses statements of every record: a first one gets
		// it once (its own try counts: nothing else showed it yet) ...
		fails.Store(1)
		res, err := p.Process(ctx, placed(t, "p", 1, "p1"))
		require.NoError(t, err)
		require.Equal(t, consumer.Applied, res.Outcome)
		// ... and then another gets it ten times in a row.
		fails.Store(10)
		r := placed(t, "o", 1, "k1")
		for range 10 {
			if res, err = p.Process(ctx, r); err == nil {
				break
			}
		}
		require.NoError(t, err)
		require.Equal(t, consumer.Applied, res.Outcome, "never dead-lettered for the pooler's fault")
		require.Contains(t, logs.String(), "docs/deployment.md")
	})

	// A handler that gets 26000 on every try of its own making (it runs a
	// statement it never prepared), while no other record does, is judged
	// like any handler error.
	t.Run("HandlersOwnPreparedStatementErrorCounts", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		e.reject = func(m *consumer.Message) error {
			if m.AggregateID == "o" {
				return &pgconn.PgError{Code: "26000", Message: `prepared statement "mine" does not exist`}
			}
			return nil
		}
		p, err := consumer.Handle(db.Pool, "svc", e, fastConfig(db, 1))
		require.NoError(t, err)
		res, err := p.Process(ctx, placed(t, "o", 1, "k1"))
		require.NoError(t, err, "not handed back for ever")
		require.Equal(t, consumer.DeadLettered, res.Outcome)
		require.Equal(t, 3, res.Attempts)
	})

	t.Run("ASickParkedSuccessorDoesNotBlockReplay", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		var sick atomic.Bool
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.IdempotencyKey == "k2" && sick.Load() {
				return statementTimeout(ctx, tx)
			}
			return e.Handle(ctx, tx, m)
		})
		p, err := consumer.Handle(db.Pool, "svc", h, fastConfig(db, 1))
		require.NoError(t, err)
		e.failKey("k1", consumer.Permanent(errBroken))
		res := processAll(t, p, 1, rec("o", 1, "k1"), rec("o", 2, "k2"))
		require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Parked}, outcomes(res))
		e.failKey("k1", nil)
		sick.Store(true)
		out, err := p.Replay(ctx, res[0].DeadLetterID)
		require.NoError(t, err, "the replayed letter applies; its sick successor is dead-lettered, not the cause of a failed replay")
		require.Equal(t, consumer.Applied, out.Outcome)
		require.Equal(t, []int64{1}, e.seqs(t, "o"))
		letters, err := lettersOf(ctx, p, nil)
		require.NoError(t, err)
		var open []int64
		for _, l := range letters {
			if l.Status == "dead" {
				open = append(open, l.Seq)
			}
		}
		require.Equal(t, []int64{2}, open)
	})

	// pgx closes the connection of a query whose deadline passes: a parked
	// successor that runs past HandlerTimeout in a drain takes the whole
	// transaction with it. Its try counts against it, not against the
	// record that released it, which applies.
	t.Run("ParkedSuccessorRunsPastHandlerTimeout", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		var runs atomic.Int32
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.IdempotencyKey == "k2" {
				runs.Add(1)
				_, err := tx.Exec(ctx, `SELECT pg_sleep(5)`)
				return err
			}
			return e.Handle(ctx, tx, m)
		})
		c := fastConfig(db, 1)
		c.HandlerTimeout = 50 * time.Millisecond
		p, err := consumer.Handle(db.Pool, "svc", h, c)
		require.NoError(t, err)
		res := processAll(t, p, 1, rec("o", 2, "k2"))
		require.Equal(t, consumer.Parked, res[0].Outcome)
		var out consumer.Result
		for range 3 {
			if out, err = p.Process(ctx, placed(t, "o", 1, "k1")); err == nil {
				break
			}
		}
		require.NoError(t, err, "the releasing record is not handed back for its successor's timeout")
		require.Equal(t, consumer.Applied, out.Outcome)
		require.Equal(t, []int64{1}, e.seqs(t, "o"))
		letters, err := lettersOf(ctx, p, nil)
		require.NoError(t, err)
		require.Len(t, letters, 1, "the successor is dead-lettered after MaxAttempts tries")
		require.Equal(t, int64(2), letters[0].Seq)
		require.Equal(t, deadletter.ReasonTimeout, letters[0].Reason)
		require.Equal(t, 3, letters[0].Attempts)
		require.Equal(t, int32(3), runs.Load(), "run MaxAttempts times, not more")
	})

	t.Run("ReplayReleasesASuccessorThatRunsPastHandlerTimeout", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		var sick atomic.Bool
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.IdempotencyKey == "k2" && sick.Load() {
				_, err := tx.Exec(ctx, `SELECT pg_sleep(5)`)
				return err
			}
			return e.Handle(ctx, tx, m)
		})
		c := fastConfig(db, 1)
		c.HandlerTimeout = 50 * time.Millisecond
		p, err := consumer.Handle(db.Pool, "svc", h, c)
		require.NoError(t, err)
		e.failKey("k1", consumer.Permanent(errBroken))
		res := processAll(t, p, 1, rec("o", 1, "k1"), rec("o", 2, "k2"))
		require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Parked}, outcomes(res))
		e.failKey("k1", nil)
		sick.Store(true)
		out, err := p.Replay(ctx, res[0].DeadLetterID)
		require.NoError(t, err, "the replay is not failed by its successor's timeout")
		require.Equal(t, consumer.Applied, out.Outcome)
		_, err = p.DrainReady(ctx)
		require.NoError(t, err)
		require.Equal(t, []int64{1}, e.seqs(t, "o"))
		letters, err := lettersOf(ctx, p, &deadletter.ListOpts{Status: deadletter.StatusDead})
		require.NoError(t, err)
		require.Len(t, letters, 1)
		require.Equal(t, int64(2), letters[0].Seq)
		require.Equal(t, deadletter.ReasonTimeout, letters[0].Reason)
	})

	// A drain holds a connection; with a pool of one there is no second
	// one for the outage probe, which asks the draining transaction
	// instead: a successor's statement timeout is its own, not an outage.
	t.Run("StatementTimeoutInADrainOnABusyPool", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, &pgtest.Opts{MaxConns: 1})
		e := newEffects(t, db)
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.IdempotencyKey == "k2" {
				return statementTimeout(ctx, tx)
			}
			return e.Handle(ctx, tx, m)
		})
		var logs lockedBuffer
		c := fastConfig(db, 1)
		c.Logger = logs.logger()
		p, err := consumer.Handle(db.Pool, "svc", h, c)
		require.NoError(t, err)
		res := processAll(t, p, 1, rec("o", 2, "k2"), rec("o", 1, "k1"))
		require.NoError(t, res[1].Err)
		require.Equal(t, []consumer.Outcome{consumer.Parked, consumer.Applied}, outcomes(res))
		require.NotContains(t, logs.String(), "database not answering")
		letters, err := lettersOf(ctx, p, nil)
		require.NoError(t, err)
		require.Len(t, letters, 1, "the successor is dead-lettered in the drain")
		require.Equal(t, int64(2), letters[0].Seq)
		require.Equal(t, 3, letters[0].Attempts)
	})

	// A serialization failure at COMMIT (a deferred trigger raises it
	// here) is the SDK's own statement failing: it never counts, however
	// often it comes; a deferred constraint's own error still does.
	t.Run("SerializationFailureAtCommitCountsNothing", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		conflict := db.Table("conflict")
		fn := db.Table("raise_conflict")
		for _, stmt := range []string{
			`CREATE TABLE ` + conflict + ` (n int)`,
			`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END $$`,
			`CREATE CONSTRAINT TRIGGER conflict_at_commit AFTER INSERT ON ` + conflict + `
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`,
		} {
			_, err := db.Pool.Exec(ctx, stmt)
			require.NoError(t, err)
		}
		var fails atomic.Int32
		fails.Store(5) // above MaxAttempts 3
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if fails.Add(-1) >= 0 {
				if _, err := tx.Exec(ctx, `INSERT INTO `+conflict+` VALUES (1)`); err != nil {
					return err
				}
			}
			return e.Handle(ctx, tx, m)
		})
		p, err := consumer.Handle(db.Pool, "svc", h, fastConfig(db, 1))
		require.NoError(t, err)
		r := placed(t, "o", 1, "k1")
		var res consumer.Result
		for range 3 {
			if res, err = p.Process(ctx, r); err == nil {
				break
			}
			var pe *pgconn.PgError
			require.ErrorAs(t, err, &pe, "handed back undone")
			require.Equal(t, "40001", pe.Code)
		}
		require.NoError(t, err)
		require.Equal(t, consumer.Applied, res.Outcome, "never dead-lettered for a conflict at commit")
		require.Equal(t, []int64{1}, e.seqs(t, "o"))
	})

	t.Run("RunnerMovesPastARecordThatAlwaysTimesOut", func(t *testing.T) {
		t.Parallel()
		b := newGroupBundle(t, 1)
		recs := []*kgo.Record{rec("sick", 1, "sick-1")}
		for i := range 60 {
			recs = append(recs, rec(fmt.Sprintf("well-%d", i%6), int64(i/6+1), fmt.Sprintf("well-%d", i)))
		}
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.AggregateID == "sick" {
				return statementTimeout(ctx, tx)
			}
			return b.effects.Handle(ctx, tx, m)
		})
		cfg := fastConfig(b.db, 1)
		cfg.PartitionBuffer = 8
		b.produce(t, recs...)
		r := b.start(t, h, cfg)
		eventually.True(t, 60*time.Second, func() bool { return b.committed(t) == int64(len(recs)) },
			"the partition committed to its end")
		rows, distinct := b.effects.count(t)
		require.Equal(t, 60, rows)
		require.Equal(t, 60, distinct)
		letters, err := lettersOf(ctx, r.c.Processor(), nil)
		require.NoError(t, err)
		require.Len(t, letters, 1)
		require.Equal(t, "sick", letters[0].AggregateID)
	})
}

// outage is a database that, while on, fails every new connection and
// statement as a restarting server does; transactions already begun keep
// their connection.
type outage struct {
	consumer.DB
	on atomic.Bool
}

var errDown = &pgconn.PgError{Code: "57P03", Message: "the database system is starting up"}

func (o *outage) Begin(ctx context.Context) (pgx.Tx, error) {
	if o.on.Load() {
		return nil, errDown
	}
	return o.DB.Begin(ctx)
}

func (o *outage) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if o.on.Load() {
		return pgconn.CommandTag{}, errDown
	}
	return o.DB.Exec(ctx, sql, args...)
}

func (o *outage) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if o.on.Load() {
		return failedRow{}
	}
	return o.DB.QueryRow(ctx, sql, args...)
}

func (o *outage) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	if o.on.Load() {
		return nil, errDown
	}
	return o.DB.Acquire(ctx)
}

func (o *outage) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if o.on.Load() {
		return nil, errDown
	}
	return o.DB.Query(ctx, sql, args...)
}

type failedRow struct{}

func (failedRow) Scan(...any) error { return errDown }

// timesOut runs into statement_timeout for the aggregate "sick" and applies
// the others through effects.
type timesOut struct{ e *effects }

func (h timesOut) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if m.AggregateID == "sick" {
		return statementTimeout(ctx, tx)
	}
	return h.e.Handle(ctx, tx, m)
}

// batchTimesOut is timesOut as a BatchHandler.
type batchTimesOut struct{ timesOut }

func (h batchTimesOut) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	for _, m := range ms {
		if m.AggregateID == "sick" {
			return statementTimeout(ctx, tx)
		}
	}
	return batchEffects{h.e}.HandleBatch(ctx, tx, ms)
}
