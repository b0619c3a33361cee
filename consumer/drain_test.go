package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/ordering"
)

// held is how many records wait behind seq 1 in the tests below: more than
// two chunks, so that a drain in one transaction shows.
const held = 130

// maxPerTx is the most records one transaction may apply while releasing a
// long-held aggregate: the releasing record and one chunk of 50.
const maxPerTx = 51

// txRecorder applies a message by writing its sequence with the id of the
// top-level transaction it ran in, and rejects seq 1 while reject is set.
type txRecorder struct {
	db     *pgtest.DB
	table  string
	reject atomic.Bool
}

func newTxRecorder(t *testing.T, db *pgtest.DB) *txRecorder {
	t.Helper()
	h := &txRecorder{db: db, table: db.Table("applied")}
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+h.table+` (
		n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, seq bigint NOT NULL, xid bigint NOT NULL)`)
	require.NoError(t, err)
	return h
}

func (h *txRecorder) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if m.Seq == 1 && h.reject.Load() {
		return consumer.Permanent(errors.New("seq 1 rejected by the test"))
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+h.table+` (seq, xid) VALUES ($1, txid_current())`, m.Seq)
	return err
}

// batchTxRecorder is txRecorder as a BatchHandler.
type batchTxRecorder struct{ *txRecorder }

func (h batchTxRecorder) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	for _, m := range ms {
		if err := h.Handle(ctx, tx, m); err != nil {
			return err
		}
	}
	return nil
}

func (h *txRecorder) handler(md mode) consumer.Handler {
	if md.batchHandler {
		return batchTxRecorder{h}
	}
	return h
}

// check requires seqs 1..n applied once each, in order, and no
// transaction that applied more than maxPerTx of them.
func (h *txRecorder) check(t *testing.T, n int) {
	t.Helper()
	ctx := context.Background()
	rows, err := h.db.Pool.Query(ctx, `SELECT seq FROM `+h.table+` ORDER BY n`)
	require.NoError(t, err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i + 1)
	}
	require.Equal(t, want, seqs)
	var most int
	require.NoError(t, h.db.Pool.QueryRow(ctx, `SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM `+h.table+` GROUP BY xid) AS per_tx`).Scan(&most))
	require.LessOrEqual(t, most, maxPerTx, "one transaction applied %d records", most)
}

func (h *txRecorder) applied(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, h.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+h.table).Scan(&n))
	return n
}

// heldRecords returns seq 1 and the records 2..held+1 behind it.
func heldRecords() (*kgo.Record, []*kgo.Record) {
	var rest []*kgo.Record
	for s := int64(2); s <= held+1; s++ {
		rest = append(rest, rec("o", s, "o-"+strconv.FormatInt(s, 10)))
	}
	return rec("o", 1, "o-1"), rest
}

// TestLongReleaseDrainsInChunks: an aggregate held for long is released in
// transactions of at most one chunk each, resuming where the last stopped,
// whether a late record, an operator's Replay or a restart releases it.
func TestLongReleaseDrainsInChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, md := range modes {
		t.Run("LateRecord/"+md.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, nil)
			h := newTxRecorder(t, db)
			p, err := consumer.Handle(db.Pool, "svc", h.handler(md), fastConfig(db, md.batch))
			require.NoError(t, err)
			first, rest := heldRecords()
			for _, r := range processAll(t, p, md.batch, rest...) {
				require.Equal(t, consumer.Parked, r.Outcome)
			}
			res := processAll(t, p, 1, first)
			require.Equal(t, consumer.Applied, res[0].Outcome)
			require.Equal(t, held, res[0].Drained)
			h.check(t, held+1)
		})
		t.Run("Replay/"+md.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t, nil)
			h := newTxRecorder(t, db)
			h.reject.Store(true)
			p, err := consumer.Handle(db.Pool, "svc", h.handler(md), fastConfig(db, md.batch))
			require.NoError(t, err)
			first, rest := heldRecords()
			res := processAll(t, p, 1, first)
			require.Equal(t, consumer.DeadLettered, res[0].Outcome)
			for _, r := range processAll(t, p, md.batch, rest...) {
				require.Equal(t, consumer.Parked, r.Outcome)
			}
			h.reject.Store(false)
			replayed, err := p.Replay(ctx, res[0].DeadLetterID)
			require.NoError(t, err)
			require.Equal(t, consumer.Applied, replayed.Outcome)
			require.Equal(t, maxPerTx-1, replayed.Drained, "Replay returns after its record and the first chunk")
			require.Equal(t, maxPerTx, h.applied(t))

			// A restart drops everything in memory: the rest is found
			// in the tables.
			restarted, err := consumer.Handle(db.Pool, "svc", h.handler(md), fastConfig(db, md.batch))
			require.NoError(t, err)
			n, err := restarted.DrainReady(ctx)
			require.NoError(t, err)
			require.Equal(t, held-(maxPerTx-1), n)
			h.check(t, held+1)
			gaps, err := allGaps(ctx, restarted)
			require.NoError(t, err)
			require.Empty(t, gaps)
			n, err = restarted.DrainReady(ctx)
			require.NoError(t, err)
			require.Zero(t, n)
		})
	}
	t.Run("ResolveGap", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		h := newTxRecorder(t, db)
		p, err := consumer.Handle(db.Pool, "svc", h, fastConfig(db, 1))
		require.NoError(t, err)
		_, rest := heldRecords()
		processAll(t, p, 1, rest...)
		n, err := p.ResolveGap(ctx, ordering.Aggregate{Type: "order", ID: "o"})
		require.NoError(t, err)
		require.Equal(t, maxPerTx-1, n)
		n, err = p.DrainReady(ctx)
		require.NoError(t, err)
		require.Equal(t, held-(maxPerTx-1), n)
		rows, err := db.Pool.Query(ctx, `SELECT seq FROM `+h.table+` ORDER BY n`)
		require.NoError(t, err)
		seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.Len(t, seqs, held)
		for i, s := range seqs {
			require.EqualValues(t, i+2, s)
		}
	})
}

// TestRunDrainsWhatReplayLeft: the rest of a release that an operator's
// Replay did not wait for is applied by the running consumer, with no call
// to DrainReady.
func TestRunDrainsWhatReplayLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newGroupBundle(t, 1)
	h := newTxRecorder(t, b.db)
	h.reject.Store(true)
	first, rest := heldRecords()
	b.produce(t, append([]*kgo.Record{first}, rest...)...)
	r := b.start(t, h, fastConfig(b.db, 1))
	p := r.c.Processor()
	var letter int64
	eventually.True(t, 30*time.Second, func() bool {
		gaps, err := allGaps(ctx, p)
		require.NoError(t, err)
		if len(gaps) != 1 || gaps[0].Parked != held {
			return false
		}
		letter = gaps[0].DeadLetterID
		return true
	}, "seq 1 dead-lettered and the rest parked behind it")
	h.reject.Store(false)
	res, err := p.Replay(ctx, letter)
	require.NoError(t, err)
	require.Equal(t, maxPerTx-1, res.Drained)
	eventually.True(t, 30*time.Second, func() bool { return h.applied(t) == held+1 }, "the rest drained by Run")
	h.check(t, held+1)
}
