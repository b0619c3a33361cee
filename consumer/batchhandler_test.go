package consumer_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
)

func TestBatchHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*consumer.Processor, *effects, *pgtest.DB) {
		t.Helper()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		p, err := consumer.Handle(db.Pool, "svc", batchEffects{e}, fastConfig(db, 50))
		require.NoError(t, err)
		return p, e, db
	}

	t.Run("HandleBatchRunsOncePerBatchAndHandleNever", func(t *testing.T) {
		t.Parallel()
		p, e, _ := setup(t)
		res := processAll(t, p, 4, rec("a", 1, "a1"), rec("a", 2, "a2"), rec("b", 1, "b1"), rec("a", 1, "a1"))
		require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.Applied, consumer.Duplicate}, outcomes(res))
		res = processAll(t, p, 4, rec("b", 2, "b2"), rec("n", 0, "n"), rec("a", 3, "a3"), rec("b", 3, "b3"))
		require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.Applied, consumer.Applied}, outcomes(res))
		for _, r := range res {
			require.Equal(t, 1, r.Attempts)
		}
		// Redelivered: nothing fresh, so no call at all.
		res = processAll(t, p, 4, rec("a", 1, "a1"), rec("a", 2, "a2"))
		require.Equal(t, []consumer.Outcome{consumer.Duplicate, consumer.Duplicate}, outcomes(res))

		require.Equal(t, [][]string{{"a1", "a2", "b1"}, {"b2", "n", "a3", "b3"}}, e.batchKeys(),
			"the fresh messages, in order, one call per batch")
		require.Zero(t, e.handleCalls())
		require.Equal(t, []int64{1, 2, 3}, e.seqs(t, "a"))
		require.Equal(t, []int64{1, 2, 3}, e.seqs(t, "b"))
	})

	// The batch's rows are written before HandleBatch fails, so a batch
	// that was not rolled back would show them twice.
	for _, fail := range []struct {
		name    string
		set     func(*effects)
		wantErr string
	}{
		{"Error", func(e *effects) { e.setFail("bad", errBroken) }, "downstream broken"},
		{"Panic", func(e *effects) { e.mu.Lock(); e.panicOn["bad"] = true; e.mu.Unlock() }, "handler panicked: handler bug for bad"},
	} {
		t.Run("Failing"+fail.name+"FallsBackAndDeadLettersOnlyTheCulprit", func(t *testing.T) {
			t.Parallel()
			p, e, _ := setup(t)
			fail.set(e)
			res := processAll(t, p, 50,
				rec("good", 1, "g1"), rec("bad", 1, "x1"), rec("good", 2, "g2"), rec("free", 0, "f"), rec("bad", 2, "x2"))
			require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.DeadLettered, consumer.Applied, consumer.Applied,
				consumer.Parked}, outcomes(res))
			require.Equal(t, [][]string{{"g1", "x1", "g2", "f", "x2"}}, e.batchKeys(), "one try of the whole batch")

			// Then one by one through Handle: the culprit as often as
			// MaxAttempts allows, HandleBatch's failure not counted, and
			// its successor parked untried.
			require.Equal(t, 3, e.callsOf("x1"))
			require.Equal(t, 3, res[1].Attempts)
			require.ErrorContains(t, res[1].Err, fail.wantErr)
			for i, k := range map[int]string{0: "g1", 2: "g2", 3: "f"} {
				require.Equal(t, 1, e.callsOf(k), k)
				require.Equal(t, 1, res[i].Attempts, k)
			}
			require.Zero(t, e.callsOf("x2"))
			rows, distinct := e.count(t)
			require.Equal(t, 3, rows, "the others applied once")
			require.Equal(t, 3, distinct)
			require.Equal(t, []int64{1, 2}, e.seqs(t, "good"))

			letters, err := lettersOf(ctx, p, nil)
			require.NoError(t, err)
			require.Len(t, letters, 1)
			require.Equal(t, "x1", letters[0].IdempotencyKey)
			require.Equal(t, 3, letters[0].Attempts)
			require.Contains(t, letters[0].Error, fail.wantErr)
			if fail.name == "Panic" {
				require.Contains(t, letters[0].Stack, "effects).Handle", "the stack of the record's own run")
			}
		})
	}

	t.Run("PermanentFromHandleBatchBlamesNoRecord", func(t *testing.T) {
		t.Parallel()
		p, e, _ := setup(t)
		e.reject = func(m *consumer.Message) error {
			if m.IdempotencyKey == "k2" && len(e.batchKeys()) > 0 && e.handleCalls() == 0 {
				return consumer.Permanent(errBroken) // in the batch only
			}
			return nil
		}
		res := processAll(t, p, 50, rec("o", 1, "k1"), rec("o", 2, "k2"))
		require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied}, outcomes(res))
		require.Equal(t, []int64{1, 2}, e.seqs(t, "o"))
	})

	// The handler's connection dies in HandleBatch: not the records'
	// fault, so they are handed back undone, not run through Handle and
	// not dead-lettered.
	t.Run("LostConnectionIsNotTheRecordsFault", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		h := batchFunc{Handler: e, batch: func(ctx context.Context, tx pgx.Tx, _ []*consumer.Message) error {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		}}
		cfg := fastConfig(db, 50)
		cfg.MaxAttempts = 1
		p, err := consumer.Handle(db.Pool, "svc", h, cfg)
		require.NoError(t, err)
		recs := []*kgo.Record{rec("o", 1, "k1"), rec("o", 2, "k2")}
		for _, r := range recs {
			r.Topic, r.Offset = "orders", nextOffset.Add(1)
		}
		res, err := p.ProcessBatch(ctx, recs)
		require.Error(t, err)
		require.Empty(t, res)
		require.Zero(t, e.handleCalls())
		var letters int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("dead_letters")).Scan(&letters))
		require.Zero(t, letters)
	})

	// ctx ends in HandleBatch: the batch is rolled back and handed back
	// undone, with ctx's error.
	t.Run("CancelledContextHandsTheBatchBack", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		cctx, cancel := context.WithCancel(ctx)
		h := batchFunc{Handler: e, batch: func(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
			if err := (batchEffects{e}).HandleBatch(ctx, tx, ms); err != nil {
				return err
			}
			cancel()
			return ctx.Err()
		}}
		p, err := consumer.Handle(db.Pool, "svc", h, fastConfig(db, 50))
		require.NoError(t, err)
		recs := []*kgo.Record{rec("o", 1, "k1"), rec("o", 2, "k2")}
		for _, r := range recs {
			r.Topic, r.Offset = "orders", nextOffset.Add(1)
		}
		_, err = p.ProcessBatch(cctx, recs)
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, e.handleCalls())
		rows, _ := e.count(t)
		require.Zero(t, rows)
		res, err := p.ProcessBatch(ctx, recs)
		require.NoError(t, err)
		require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied}, outcomes(res), "nothing was claimed")
	})
}

// batchFunc is a BatchHandler made of a Handler and a function.
type batchFunc struct {
	consumer.Handler
	batch func(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error
}

func (b batchFunc) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	return b.batch(ctx, tx, ms)
}

// The runner with a BatchHandler: a partition's records waiting together
// are one HandleBatch call, never mixed with another partition's (each
// partition flows on its own); when that call fails, its records go one by
// one through Handle, so the poison record is dead-lettered alone
// after MaxAttempts runs of Handle and never given to HandleBatch again.
func TestConsumerWithBatchHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newGroupBundle(t, 4)
	partitions := func(ms []*consumer.Message) int {
		ps := map[int32]bool{}
		for _, m := range ms {
			ps[m.Partition] = true
		}
		return len(ps)
	}
	b.produce(t, stream(12, 12)...)
	r := b.start(t, batchEffects{b.effects}, fastConfig(b.db, 50))
	eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == 12 }, "all offsets committed")
	r.stop(t)
	rows, distinct := b.effects.count(t)
	require.Equal(t, 12, rows)
	require.Equal(t, 12, distinct)
	b.effects.mu.Lock()
	widest, longest, batched := 0, 0, 0
	for _, ms := range b.effects.batches {
		widest, longest, batched = max(widest, partitions(ms)), max(longest, len(ms)), batched+len(ms)
	}
	b.effects.mu.Unlock()
	require.Equal(t, 1, widest, "each HandleBatch call holds one partition's records")
	require.Greater(t, longest, 1, "one HandleBatch call applied several records")
	// A poll that brought one record alone is applied through Handle.
	require.Equal(t, 12, batched+b.effects.handleCalls(), "each record through one of them, once")

	// A poison record among fresh records of every partition, read from
	// the start under a new group.
	b.effects.setFail("poison", errBroken)
	b.group += "-poison"
	b.produce(t, append([]*kgo.Record{rec("poison", 1, "poison-1"), rec("poison", 2, "poison-2")}, stream(12, 24)[12:]...)...)
	r = b.start(t, batchEffects{b.effects}, fastConfig(b.db, 50))
	eventually.True(t, 30*time.Second, func() bool { return b.committed(t) == 26 }, "all offsets committed")
	r.stop(t)
	rows, distinct = b.effects.count(t)
	require.Equal(t, 24, rows, "the other records applied once")
	require.Equal(t, 24, distinct)
	require.Equal(t, 3, b.effects.callsOf("poison-1"), "MaxAttempts runs of Handle")
	require.Zero(t, b.effects.callsOf("poison-2"), "parked behind the dead letter")
	withPoison := 0
	for _, keys := range b.effects.batchKeys() {
		if slices.Contains(keys, "poison-1") {
			withPoison++
		}
	}
	require.LessOrEqual(t, withPoison, 1, "after HandleBatch failed, one by one through Handle")
	letters, err := mustInspector(t, b.db.Pool, b.db.Schema).Letters(ctx, nil)
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Equal(t, "poison-1", letters[0].IdempotencyKey)
	require.Equal(t, 3, letters[0].Attempts)
}
