package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/eventually"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/ordering"
)

// incompressible returns n bytes of random text, which PostgreSQL cannot
// compress below the size of a btree index entry.
func incompressible(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawStdEncoding.EncodeToString(b)[:n]
}

// setHeader replaces (or adds) the named header of r.
func setHeader(r *kgo.Record, name, value string) *kgo.Record {
	for i, h := range r.Headers {
		if h.Key == name {
			r.Headers[i].Value = []byte(value)
			return r
		}
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: name, Value: []byte(value)})
	return r
}

// TestHostileInput feeds records from producers that break the contract at
// its edges: none of them may stop the records of other aggregates, and
// each ends as a dead letter that says what is wrong.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T, md mode, mod func(*consumer.Config)) (*consumer.Processor, *effects, *pgtest.DB) {
		t.Helper()
		db := pgtest.New(t, nil)
		e := newEffects(t, db)
		cfg := fastConfig(db, md.batch)
		if mod != nil {
			mod(cfg)
		}
		p, err := consumer.Handle(db.Pool, "svc", md.handler(e), cfg)
		require.NoError(t, err)
		return p, e, db
	}
	letter := func(t *testing.T, p *consumer.Processor, id int64) *deadletter.Letter {
		t.Helper()
		l, err := p.Inspector().Letter(ctx, id)
		require.NoError(t, err)
		return l
	}

	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()

			// Item 1: fields too long for an index are dead-lettered with
			// the limit they break, and the dead letter itself fits.
			t.Run("OverLongFieldsAreDeadLettered", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, md, nil)
				long := incompressible(3000)
				longID := rec(long, 1, "long-id")
				longType := setHeader(rec("t", 1, "long-type"), outbox.HeaderAggregateType, long)
				longKey := setHeader(rec("k", 1, "x"), outbox.HeaderIdempotencyKey, long)
				longKeyRec := rec("", 0, "")
				longKeyRec.Key = []byte(long)
				longKeyRec.Headers = []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte("e-long-record-key")},
					{Key: outbox.HeaderAggregateSeq, Value: []byte("1")}}
				res := processAll(t, p, md.batch, rec("ok", 1, "ok1"), longID, longType, longKey, longKeyRec, rec("ok", 2, "ok2"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.DeadLettered, consumer.DeadLettered,
					consumer.DeadLettered, consumer.DeadLettered, consumer.Applied}, outcomes(res))
				require.ErrorContains(t, res[1].Err, "outbox.MaxAggregateIDBytes")
				require.ErrorContains(t, res[2].Err, "outbox.MaxAggregateTypeBytes")
				require.ErrorContains(t, res[3].Err, "outbox.MaxIdempotencyKeyBytes")
				require.ErrorContains(t, res[4].Err, "outbox.MaxAggregateIDBytes")
				l := letter(t, p, res[1].DeadLetterID)
				require.Equal(t, []byte(long), l.Record.Key, "the record is kept whole")
				require.Empty(t, l.AggregateID, "the over-long field stays out of the indexed column")
				require.Equal(t, []int64{1, 2}, e.seqs(t, "ok"))
			})

			// Item 2: sequences past int4 go through every path.
			t.Run("SequencesBeyondInt32", func(t *testing.T) {
				t.Parallel()
				for _, top := range []int64{1<<31 + 3, 1<<53 + 3, math.MaxInt64} {
					t.Run(strconv.FormatInt(top, 10), func(t *testing.T) {
						t.Parallel()
						p, e, _ := setup(t, md, func(c *consumer.Config) { c.FirstSeen = ordering.FirstSeenBaseline })
						base := top - 4
						agg := "big"
						k := func(s int64) string { return "big-" + strconv.FormatInt(s, 10) }
						res := processAll(t, p, md.batch, rec(agg, base, k(base)), rec(agg, base+2, k(base+2)))
						require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Parked}, outcomes(res))
						n, err := p.ResolveGap(ctx, ordering.Aggregate{Type: "order", ID: agg})
						require.NoError(t, err)
						require.Equal(t, 1, n)
						e.failKey(k(base+3), consumer.Permanent(errBroken))
						res = processAll(t, p, md.batch, rec(agg, base+3, k(base+3)), rec(agg, top, k(top)))
						require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Parked}, outcomes(res))
						e.failKey(k(base+3), nil)
						r, err := p.Replay(ctx, res[0].DeadLetterID)
						require.NoError(t, err)
						require.Equal(t, consumer.Applied, r.Outcome)
						require.Equal(t, 1, r.Drained)
						require.Equal(t, []int64{base, base + 2, base + 3, top}, e.seqs(t, agg))
						last, _, err := p.Inspector().Position(ctx, p.Name(), ordering.Aggregate{Type: "order", ID: agg})
						require.NoError(t, err)
						require.Equal(t, top, last)
					})
				}
			})

			// Item 5: dead-lettering the first record seen of an aggregate
			// does not take its sequence as the start under FirstSeenStrict:
			// the sequences below it are still applied.
			t.Run("FirstSeenDeadLetterInventsNoBaseline", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, md, nil)
				bad := setHeader(rec("o", 3, "k3"), outbox.HeaderOccurredAt, "yesterday")
				res := processAll(t, p, md.batch, bad, rec("o", 1, "k1"), rec("o", 2, "k2"), rec("o", 4, "k4"))
				require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Applied, consumer.Applied, consumer.Parked}, outcomes(res))
				require.Equal(t, []int64{1, 2}, e.seqs(t, "o"))
			})

			// Item 6: ResolveGap never skips an open dead letter inside the
			// gap, and Gaps names the lowest one.
			t.Run("ResolveGapStopsBelowADeadLetter", func(t *testing.T) {
				t.Parallel()
				p, e, db := setup(t, md, func(c *consumer.Config) { c.MaxValueBytes = 100 })
				agg := ordering.Aggregate{Type: "order", ID: "o"}
				// 2 is lost; 3 is too large for this configuration, so it
				// is dead-lettered inside the gap; 4 parks.
				big := rec("o", 3, "k3")
				big.Value = make([]byte, 200)
				res := processAll(t, p, md.batch, rec("o", 1, "k1"), big, rec("o", 4, "k4"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.DeadLettered, consumer.Parked}, outcomes(res))
				l3 := res[1].DeadLetterID
				gaps, err := allGaps(ctx, p)
				require.NoError(t, err)
				require.Len(t, gaps, 1)
				require.Equal(t, int64(2), gaps[0].Expected)
				require.Equal(t, l3, gaps[0].DeadLetterID, "the letter inside the gap is named")
				require.Equal(t, int64(3), gaps[0].DeadLetterSeq)

				n, err := p.ResolveGap(ctx, agg)
				require.NoError(t, err)
				require.Zero(t, n, "it stopped below the letter")
				last, _, err := p.Inspector().Position(ctx, p.Name(), agg)
				require.NoError(t, err)
				require.Equal(t, int64(2), last, "2 was skipped, 3 was not")
				_, err = p.ResolveGap(ctx, agg)
				require.ErrorContains(t, err, "replay or discard it")

				// The limit is raised: a processor with the new
				// configuration replays 3, which releases 4.
				fixed, err := consumer.Handle(db.Pool, "svc", md.handler(e), fastConfig(db, md.batch))
				require.NoError(t, err)
				r, err := fixed.Replay(ctx, l3)
				require.NoError(t, err)
				require.Equal(t, consumer.Applied, r.Outcome)
				require.Equal(t, 1, r.Drained)
				require.Equal(t, []int64{1, 3, 4}, e.seqs(t, "o"))
			})

			// Item 6: a letter whose sequence the aggregate has moved past
			// is not marked replayed without being applied.
			t.Run("ReplayRefusesAPassedSequence", func(t *testing.T) {
				t.Parallel()
				p, e, db := setup(t, md, nil)
				e.failKey("k2", consumer.Permanent(errBroken))
				res := processAll(t, p, md.batch, rec("o", 1, "k1"), rec("o", 2, "k2"))
				require.Equal(t, consumer.DeadLettered, res[1].Outcome)
				_, err := db.Pool.Exec(ctx, `UPDATE `+db.Table("positions")+` SET last_seq = 5`)
				require.NoError(t, err)
				e.failKey("k2", nil)
				_, err = p.Replay(ctx, res[1].DeadLetterID)
				require.ErrorIs(t, err, consumer.ErrSequencePassed)
				require.Equal(t, deadletter.StatusDead, letter(t, p, res[1].DeadLetterID).Status)
				require.Equal(t, []int64{1}, e.seqs(t, "o"))
			})

			// Item 7: a different record at the place of a dead letter gets
			// its own letter; a resolved letter stays resolved.
			t.Run("DifferentRecordAtTheSameOffsetGetsItsOwnLetter", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, md, nil)
				e.setFail("bad", consumer.Permanent(errBroken))
				a, b := rec("bad", 0, "a"), rec("bad", 0, "b")
				a.Topic, b.Topic = "orders", "orders"
				a.Offset, b.Offset = 7, 7
				ra, err := p.Process(ctx, a)
				require.NoError(t, err)
				rb, err := p.Process(ctx, b)
				require.NoError(t, err)
				require.Equal(t, consumer.DeadLettered, rb.Outcome)
				require.NotEqual(t, ra.DeadLetterID, rb.DeadLetterID)
				require.Equal(t, "b", letter(t, p, rb.DeadLetterID).IdempotencyKey)
				_, err = p.Discard(ctx, ra.DeadLetterID)
				require.NoError(t, err)
				again, err := p.Process(ctx, b)
				require.NoError(t, err)
				require.Equal(t, rb.DeadLetterID, again.DeadLetterID, "the same record failing again updates its letter")
				require.Equal(t, deadletter.StatusDiscarded, letter(t, p, ra.DeadLetterID).Status)
				require.Equal(t, 2, letter(t, p, rb.DeadLetterID).Attempts)
			})

			// Item 8: a malformed record that comes back after its letter
			// was resolved is a duplicate, keyed or not.
			t.Run("RedeliveredMalformedRecordStaysResolved", func(t *testing.T) {
				t.Parallel()
				p, _, _ := setup(t, md, nil)
				keyed := setHeader(rec("o", 0, "keyed"), outbox.HeaderOccurredAt, "yesterday")
				keyless := &kgo.Record{Key: []byte("nokey"), Value: []byte("v")}
				res := processAll(t, p, 1, keyed, keyless)
				require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.DeadLettered}, outcomes(res))
				for _, r := range res {
					_, err := p.Discard(ctx, r.DeadLetterID)
					require.NoError(t, err)
				}
				for i, r := range []*kgo.Record{keyed, keyless} {
					again, err := p.Process(ctx, r)
					require.NoError(t, err)
					require.Equal(t, consumer.Duplicate, again.Outcome)
					require.Equal(t, deadletter.StatusDiscarded, letter(t, p, res[i].DeadLetterID).Status)
				}
			})

			// A letter beyond the next sequence with nothing parked behind
			// it is still a hole the operator can see and resolve (found by
			// the model-based test).
			t.Run("ALetterAheadWithNothingParkedIsAGap", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, md, func(c *consumer.Config) { c.MaxValueBytes = 100 })
				big := rec("o", 5, "garbage")
				big.Value = make([]byte, 200)
				res := processAll(t, p, md.batch, rec("o", 1, "k1"), big)
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.DeadLettered}, outcomes(res))
				_, err := p.Discard(ctx, res[1].DeadLetterID)
				require.ErrorIs(t, err, consumer.ErrNotNext)
				agg := ordering.Aggregate{Type: "order", ID: "o"}
				gaps, err := allGaps(ctx, p)
				require.NoError(t, err)
				require.Empty(t, gaps, "nothing is parked: the letter is with the letters")
				gap, err := consumer.GapOf(ctx, p, agg)
				require.NoError(t, err)
				require.NotNil(t, gap)
				require.Equal(t, agg, gap.Aggregate)
				require.EqualValues(t, 2, gap.Expected)
				require.Zero(t, gap.Parked)
				require.Equal(t, res[1].DeadLetterID, gap.DeadLetterID)
				require.EqualValues(t, 5, gap.DeadLetterSeq)
				n, err := p.ResolveGap(ctx, agg)
				require.NoError(t, err)
				require.Zero(t, n)
				_, err = p.Discard(ctx, res[1].DeadLetterID)
				require.NoError(t, err)
				gap, err = consumer.GapOf(ctx, p, agg)
				require.NoError(t, err)
				require.Nil(t, gap)
				last, _, err := p.Inspector().Position(ctx, p.Name(), agg)
				require.NoError(t, err)
				require.EqualValues(t, 5, last)
				require.Equal(t, []int64{1}, e.seqs(t, "o"))
			})

			// Item 8: a malformed record whose key an applied event claimed
			// is a duplicate of that event, not a new letter.
			t.Run("MalformedRecordWithAnAppliedKeyIsADuplicate", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, md, nil)
				res := processAll(t, p, md.batch, rec("o", 1, "k1"))
				require.Equal(t, consumer.Applied, res[0].Outcome)
				again := setHeader(rec("o", 1, "k1"), outbox.HeaderOccurredAt, "yesterday")
				res = processAll(t, p, 1, again)
				require.Equal(t, consumer.Duplicate, res[0].Outcome)
				letters, err := lettersOf(ctx, p, nil)
				require.NoError(t, err)
				require.Empty(t, letters)
				require.Equal(t, []int64{1}, e.seqs(t, "o"))
			})

			// Item 9: a new event at a sequence already applied is
			// dead-lettered; the event that took it, redelivered, is a
			// quiet duplicate.
			t.Run("ANewKeyAtAnAppliedSequenceIsDeadLettered", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, md, nil)
				res := processAll(t, p, md.batch, rec("o", 1, "k1"), rec("o", 2, "k2"), rec("o", 1, "other1"), rec("o", 1, "k1"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.DeadLettered, consumer.Duplicate}, outcomes(res))
				require.ErrorContains(t, res[2].Err, "sequence 1 of order/o is behind its aggregate's position 2")
				var reused *consumer.SequenceReusedError
				require.ErrorAs(t, res[2].Err, &reused)
				require.Equal(t, []int64{1, 2}, e.seqs(t, "o"))
			})

			// Item 9: a new event at a sequence that is parked already, and
			// a record with two different sequences.
			t.Run("ReusedOrAmbiguousSequencesAreDeadLettered", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, md, nil)
				twice := rec("o", 2, "twice")
				twice.Headers = append(twice.Headers, kgo.RecordHeader{Key: outbox.HeaderAggregateSeq, Value: []byte("5")})
				res := processAll(t, p, md.batch, rec("o", 1, "k1"), rec("o", 3, "k3"), rec("o", 3, "other3"), twice, rec("o", 2, "k2"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Parked, consumer.DeadLettered, consumer.DeadLettered,
					consumer.Applied}, outcomes(res))
				require.ErrorContains(t, res[2].Err, "sequence 3 of order/o is already parked for another event")
				require.ErrorContains(t, res[3].Err, "twice, with different values")
				require.Equal(t, []int64{1, 2, 3}, e.seqs(t, "o"))
			})

			// Item 10: reasons say what is wrong and what to do.
			t.Run("ReasonsSayWhatToDo", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, md, nil)
				binarySeq := &kgo.Record{Key: []byte{0xff, 0xfe}, Headers: []kgo.RecordHeader{
					{Key: outbox.HeaderEventID, Value: []byte("bin-seq")}, {Key: outbox.HeaderAggregateSeq, Value: []byte("1")}}}
				binary := &kgo.Record{Key: []byte{0xff, 0xfe}, Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte("bin")}}}
				emptyKey := &kgo.Record{Key: []byte("o"), Headers: []kgo.RecordHeader{{Key: outbox.HeaderIdempotencyKey}}}
				res := processAll(t, p, md.batch, binarySeq, binary, emptyKey)
				require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Applied, consumer.DeadLettered}, outcomes(res))
				require.ErrorContains(t, res[0].Err, "the record key is not UTF-8 text; set the outbox-aggregate-id header")
				require.ErrorContains(t, res[2].Err, "header outbox-idempotency-key is empty")
				require.Equal(t, []int64{0}, e.seqs(t, ""), "a binary key without a sequence is applied without an aggregate id")
			})
		})
	}
}

// placed builds the record rec would, placed in topic orders.
func placed(t *testing.T, agg string, seq int64, key string) *kgo.Record {
	t.Helper()
	r := rec(agg, seq, key)
	r.Topic, r.Offset = "orders", nextOffset.Add(1)
	return r
}

// TestHandlerTimeout: a handler that hangs is bounded by
// Config.HandlerTimeout, retried, and dead-lettered naming the timeout; a
// caller's deadline is reported as the caller's.
func TestHandlerTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hang := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.AggregateID == "slow" {
			<-ctx.Done()
			return ctx.Err()
		}
		// The healthy record's statement ignores the 20 ms deadline: on a
		// loaded machine a round trip can take longer, and only "slow" may
		// time out.
		_, err := tx.Exec(context.WithoutCancel(ctx), `SELECT 1`)
		return err
	})

	t.Run("DeadLetteredAfterItsAttempts", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		cfg := fastConfig(db, 1)
		cfg.HandlerTimeout = 20 * time.Millisecond
		p, err := consumer.Handle(db.Pool, "svc", hang, cfg)
		require.NoError(t, err)
		res := processAll(t, p, 1, rec("slow", 1, "s1"), rec("fast", 1, "f1"))
		require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Applied}, outcomes(res))
		var te *consumer.HandlerTimeoutError
		require.ErrorAs(t, res[0].Err, &te)
		require.Equal(t, 3, res[0].Attempts, "a timeout is a failed attempt")
		require.ErrorContains(t, res[0].Err, "Config.HandlerTimeout (20ms)")
	})

	t.Run("CallersDeadlineIsReportedAsSuch", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t, nil)
		p, err := consumer.Handle(db.Pool, "svc", hang, fastConfig(db, 1))
		require.NoError(t, err)
		r := placed(t, "slow", 1, "s1")
		r.Offset = 7
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err = p.Process(cctx, r)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, "record orders/0@7: handler did not finish before the context's deadline")
	})
}

// TestRunAbandonsAHandlerThatIgnoresItsContext: Run returns soon after
// ShutdownGrace even when a handler never looks at its ctx, and the
// handler's transaction is rolled back, holding no lock.
func TestRunAbandonsAHandlerThatIgnoresItsContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newGroupBundle(t, 1)
	entered, release, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		close(entered)
		<-release // ignores ctx
		close(returned)
		return nil
	})
	cfg := fastConfig(b.db, 1)
	cfg.ShutdownGrace = 50 * time.Millisecond
	b.produce(t, rec("o", 1, "stuck"))
	cl := b.client(t, b.group)
	c, err := consumer.New(b.db.Pool, cl, "svc", h, cfg)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	<-entered
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run waited for a handler that ignores its ctx")
	}
	select {
	case <-returned:
		t.Fatal("the handler returned: the test proves nothing")
	default:
	}
	// The abandoned transaction had claimed the key; its session is gone,
	// so the claim is free.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`)
	require.NoError(t, err)
	tag, err := tx.Exec(ctx, `INSERT INTO `+b.db.Table("processed_keys")+` (consumer, key) VALUES ('svc', 'stuck')`)
	require.NoError(t, err, "the abandoned transaction still holds the key")
	require.EqualValues(t, 1, tag.RowsAffected())
	require.NoError(t, tx.Rollback(ctx))
	close(release)
	<-returned
	cl.Close()
}

// hangOn is a handler that never returns for aggregate "hang" until its
// ctx ends, and is next otherwise. next runs without the handler's
// deadline, so that a slow machine never turns a healthy record into a
// HandlerTimeout: only "hang" times out.
type hangOn struct{ next consumer.Handler }

func (h hangOn) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if m.AggregateID == "hang" {
		<-ctx.Done()
		return ctx.Err()
	}
	return h.next.Handle(context.WithoutCancel(ctx), tx, m)
}

// batchHangOn is hangOn as a BatchHandler.
type batchHangOn struct {
	hangOn
	next consumer.BatchHandler
}

func (h batchHangOn) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	for _, m := range ms {
		if m.AggregateID == "hang" {
			<-ctx.Done()
			return ctx.Err()
		}
	}
	return h.next.HandleBatch(context.WithoutCancel(ctx), tx, ms)
}

// TestRunTakesEveryPartitionPastHostileRecords: the runner, fed hostile
// records among good ones on three partitions (an over-long key, a binary
// record key with a sequence, a sequence that is not a number, a handler
// that hangs, one that panics), applies every good record, dead-letters
// each hostile one, and commits every partition to its end.
func TestRunTakesEveryPartitionPastHostileRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, md := range runnerModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			b := newGroupBundle(t, 3)
			var recs []*kgo.Record
			for seq := int64(1); seq <= 5; seq++ {
				for a := range 9 {
					agg := fmt.Sprintf("good-%d", a)
					recs = append(recs, rec(agg, seq, fmt.Sprintf("%s-%d", agg, seq)))
				}
			}
			binary := rec("bin", 1, "bin-1")
			binary.Key = []byte{0xff, 0xfe, 0x00}
			binary.Headers = slices.DeleteFunc(binary.Headers, func(h kgo.RecordHeader) bool { return h.Key == outbox.HeaderAggregateID })
			hostile := []*kgo.Record{
				rec("long", 1, strings.Repeat("k", outbox.MaxIdempotencyKeyBytes+1)),
				binary,
				setHeader(rec("badseq", 1, "badseq-1"), outbox.HeaderAggregateSeq, "one"),
				rec("hang", 1, "hang-1"),
				rec("boom", 1, "boom-1"),
			}
			for i, h := range hostile {
				recs = slices.Insert(recs, 5+i*9, h)
			}
			b.effects.panicOn["boom"] = true
			var h consumer.Handler = hangOn{next: b.effects}
			if md.batchHandler {
				h = batchHangOn{hangOn: hangOn{next: b.effects}, next: batchEffects{b.effects}}
			}
			cfg := md.config(b.db)
			cfg.HandlerTimeout, cfg.MaxAttempts = 100*time.Millisecond, 2
			b.produce(t, recs...)
			r := b.start(t, h, cfg)
			eventually.True(t, 60*time.Second, func() bool { return b.committed(t) == int64(len(recs)) },
				"every partition committed to its end")
			rows, distinct := b.effects.count(t)
			require.Equal(t, 45, rows)
			require.Equal(t, 45, distinct)
			letters, err := lettersOf(ctx, r.c.Processor(), nil)
			require.NoError(t, err)
			require.Len(t, letters, len(hostile))
			for a := range 9 {
				require.Equal(t, []int64{1, 2, 3, 4, 5}, b.effects.seqs(t, fmt.Sprintf("good-%d", a)))
			}
		})
	}
}
