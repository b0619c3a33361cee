package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/mock/gomock"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/ordering"
)

func TestHandleConfig(t *testing.T) {
	t.Parallel()
	h := consumer.HandlerFunc(func(context.Context, pgxTx, *consumer.Message) error { return nil })
	db := NewMockDB(gomock.NewController(t)) // never called: Handle only checks its config
	tests := []struct {
		name    string
		cname   string
		cfg     *consumer.Config
		wantErr string
	}{
		{"Defaults", "svc", nil, ""},
		{"EmptyName", "", nil, "consumer: empty consumer name"},
		{"ZeroAttempts", "svc", &consumer.Config{MaxAttempts: -1}, "MaxAttempts"},
		{"BackoffNotARange", "svc", &consumer.Config{MinBackoff: 2, MaxBackoff: 1}, "backoff bounds"},
		{"NegativeRetention", "svc", &consumer.Config{KeyRetention: -1}, "negative KeyRetention"},
		{"NegativeReplayWindow", "svc", &consumer.Config{ReplayWindow: -1}, "negative ReplayWindow"},
		{"ZeroBatch", "svc", &consumer.Config{BatchSize: -1}, "BatchSize"},
		{"NegativeGrace", "svc", &consumer.Config{ShutdownGrace: -1}, "negative ShutdownGrace"},
		{"UnknownGapPolicy", "svc", &consumer.Config{GapPolicy: 7}, "consumer: unknown GapPolicy 7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := consumer.Handle(db, tt.cname, h, tt.cfg)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestProcessor(t *testing.T) {
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

	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()

			t.Run("DuplicatesApplyOnce", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, mode, nil)
				res := processAll(t, p, mode.batch,
					rec("o-1", 1, "k1"), rec("o-1", 1, "k1"), rec("o-2", 0, "k2"), rec("o-2", 0, "k2"), rec("o-1", 2, "k3"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Duplicate, consumer.Applied, consumer.Duplicate, consumer.Applied}, outcomes(res))
				// Redelivery of the whole stream, as after an offset reset.
				res = processAll(t, p, mode.batch, rec("o-1", 1, "k1"), rec("o-2", 0, "k2"), rec("o-1", 2, "k3"))
				require.Equal(t, []consumer.Outcome{consumer.Duplicate, consumer.Duplicate, consumer.Duplicate}, outcomes(res))
				// The same sequence under a new key is another event
				// reusing it: dead-lettered, visibly, not a duplicate.
				res = processAll(t, p, mode.batch, rec("o-1", 2, "k3-again"))
				require.Equal(t, consumer.DeadLettered, res[0].Outcome)
				var reused *consumer.SequenceReusedError
				require.ErrorAs(t, res[0].Err, &reused)
				require.ErrorContains(t, res[0].Err, "sequence 2 of order/o-1 is behind its aggregate's position 2")
				rows, distinct := e.count(t)
				require.Equal(t, 3, rows)
				require.Equal(t, 3, distinct)
			})

			t.Run("OutOfOrderRecordsParkAndDrainInOrder", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, mode, nil)
				res := processAll(t, p, mode.batch,
					rec("o-1", 1, "a1"), rec("o-1", 3, "a3"), rec("o-1", 4, "a4"), rec("o-2", 1, "b1"),
					rec("o-1", 3, "a3"), // redelivered while parked
					rec("o-1", 2, "a2"), rec("o-1", 7, "a7"), rec("o-1", 5, "a5"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Parked, consumer.Parked, consumer.Applied,
					consumer.Duplicate, consumer.Applied, consumer.Parked, consumer.Applied}, outcomes(res))
				require.Equal(t, 2, res[5].Drained)
				require.Equal(t, []int64{1, 2, 3, 4, 5}, e.seqs(t, "o-1"))

				// 6 never comes: the operator sees the gap and skips it.
				gaps, err := allGaps(ctx, p)
				require.NoError(t, err)
				require.Len(t, gaps, 1)
				require.Equal(t, ordering.OpenGap{Aggregate: ordering.Aggregate{Type: "order", ID: "o-1"}, Last: 5, Expected: 6,
					FirstParked: 7, Parked: 1, Since: gaps[0].Since}, gaps[0])
				n, err := p.ResolveGap(ctx, ordering.Aggregate{Type: "order", ID: "o-1"})
				require.NoError(t, err)
				require.Equal(t, 1, n)
				require.Equal(t, []int64{1, 2, 3, 4, 5, 7}, e.seqs(t, "o-1"))
				// 6 comes after all, past the skip: dead-lettered, so
				// that it is seen, and 8 goes on.
				res = processAll(t, p, mode.batch, rec("o-1", 6, "a6"), rec("o-1", 8, "a8"))
				require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Applied}, outcomes(res))
			})

			t.Run("PoisonRecordIsDeadLetteredAndHoldsOnlyItsAggregate", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, mode, nil)
				e.setFail("bad", errBroken)
				res := processAll(t, p, mode.batch,
					rec("bad", 1, "x1"), rec("good", 1, "g1"), rec("bad", 2, "x2"), rec("good", 2, "g2"), rec("bad", 3, "x3"), rec("free", 0, "f"))
				require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Applied, consumer.Parked, consumer.Applied,
					consumer.Parked, consumer.Applied}, outcomes(res))
				require.Equal(t, 3, res[0].Attempts)
				require.Equal(t, 3, e.callsOf("x1"), "tried MaxAttempts times")
				require.Zero(t, e.callsOf("x2"), "successors are parked, not tried")
				require.Equal(t, []int64{1, 2}, e.seqs(t, "good"))

				letters, err := lettersOf(ctx, p, &deadletter.ListOpts{Consumer: "svc", Status: deadletter.StatusDead})
				require.NoError(t, err)
				require.Len(t, letters, 1)
				require.Contains(t, letters[0].Error, "downstream broken")
				require.Equal(t, 3, letters[0].Attempts)
				require.EqualValues(t, 1, letters[0].Seq)
				gaps, err := allGaps(ctx, p)
				require.NoError(t, err)
				require.Len(t, gaps, 1)
				require.Equal(t, letters[0].ID, gaps[0].DeadLetterID)
				_, err = p.ResolveGap(ctx, gaps[0].Aggregate)
				require.ErrorContains(t, err, "replay or discard")

				// Still broken: the replay fails and changes nothing.
				_, err = p.Replay(ctx, letters[0].ID)
				require.ErrorIs(t, err, errBroken)
				require.Empty(t, e.seqs(t, "bad"))

				// Fixed: the replay applies it once and drains its successors.
				e.setFail("bad", nil)
				r, err := p.Replay(ctx, letters[0].ID)
				require.NoError(t, err)
				require.Equal(t, consumer.Applied, r.Outcome)
				require.Equal(t, 2, r.Drained)
				require.Equal(t, []int64{1, 2, 3}, e.seqs(t, "bad"))
				_, err = p.Replay(ctx, letters[0].ID)
				require.ErrorIs(t, err, deadletter.ErrResolved)
				res = processAll(t, p, mode.batch, rec("bad", 1, "x1"), rec("bad", 4, "x4"))
				require.Equal(t, []consumer.Outcome{consumer.Duplicate, consumer.Applied}, outcomes(res))
				rows, distinct := e.count(t)
				require.Equal(t, rows, distinct)
			})

			t.Run("PermanentErrorSkipsRetries", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, mode, nil)
				e.setFail("bad", consumer.Permanent(errBroken))
				res := processAll(t, p, mode.batch, rec("bad", 0, "x"), rec("ok", 0, "y"))
				require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Applied}, outcomes(res))
				require.Equal(t, 1, e.callsOf("x"))
				require.True(t, consumer.IsPermanent(res[0].Err))
			})

			t.Run("PanicIsRecoveredWithItsStack", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, mode, nil)
				e.mu.Lock()
				e.panicOn["bad"] = true
				e.mu.Unlock()
				res := processAll(t, p, mode.batch, rec("bad", 1, "x"), rec("ok", 1, "y"))
				require.Equal(t, []consumer.Outcome{consumer.DeadLettered, consumer.Applied}, outcomes(res))
				l, err := p.Inspector().Letter(ctx, res[0].DeadLetterID)
				require.NoError(t, err)
				require.Contains(t, l.Error, "handler panicked: handler bug for bad")
				require.Contains(t, l.Stack, "effects).Handle")
			})

			t.Run("DiscardReleasesSuccessors", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, mode, nil)
				e.setFail("bad", consumer.Permanent(errBroken))
				res := processAll(t, p, mode.batch, rec("bad", 1, "x1"))
				e.setFail("bad", nil)
				res2 := processAll(t, p, mode.batch, rec("bad", 2, "x2"), rec("bad", 3, "x3"))
				require.Equal(t, []consumer.Outcome{consumer.Parked, consumer.Parked}, outcomes(res2))
				n, err := p.Discard(ctx, res[0].DeadLetterID)
				require.NoError(t, err)
				require.Equal(t, 2, n)
				require.Equal(t, []int64{2, 3}, e.seqs(t, "bad"))
				l, err := p.Inspector().Letter(ctx, res[0].DeadLetterID)
				require.NoError(t, err)
				require.Equal(t, deadletter.StatusDiscarded, l.Status)
				res = processAll(t, p, mode.batch, rec("bad", 1, "x1"))
				require.Equal(t, consumer.Duplicate, res[0].Outcome, "a discarded record that comes back is skipped")
			})

			t.Run("FailingDrainedRecordIsDeadLetteredAlone", func(t *testing.T) {
				t.Parallel()
				p, e, _ := setup(t, mode, nil)
				res := processAll(t, p, mode.batch, rec("mid", 1, "m1"), rec("mid", 2, "m2"), rec("mid", 3, "m3"))
				require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.Applied}, outcomes(res))
				res = processAll(t, p, mode.batch, rec("mid", 5, "m5"), rec("mid", 6, "m6"))
				require.Equal(t, []consumer.Outcome{consumer.Parked, consumer.Parked}, outcomes(res))
				// The drained record 5 fails, not 4 that releases it: 4 is
				// applied, 5 dead-lettered in the same transaction, 6 stays.
				e.failKey("m5", errBroken)
				res = processAll(t, p, mode.batch, rec("mid", 4, "m4"))
				require.Equal(t, consumer.Applied, res[0].Outcome)
				require.Zero(t, res[0].Drained)
				require.Equal(t, []int64{1, 2, 3, 4}, e.seqs(t, "mid"))
				letters, err := lettersOf(ctx, p, nil)
				require.NoError(t, err)
				require.Len(t, letters, 1)
				require.EqualValues(t, 5, letters[0].Seq)
				e.failKey("m5", nil)
				r, err := p.Replay(ctx, letters[0].ID)
				require.NoError(t, err)
				require.Equal(t, 1, r.Drained)
				require.Equal(t, []int64{1, 2, 3, 4, 5, 6}, e.seqs(t, "mid"))
			})
		})
	}

	t.Run("GapFailReturnsAGapError", func(t *testing.T) {
		t.Parallel()
		p, e, _ := setup(t, mode{batch: 1}, func(c *consumer.Config) { c.GapPolicy = ordering.GapFail })
		processAll(t, p, 1, rec("o", 1, "a1"))
		r := rec("o", 3, "a3")
		r.Topic = "orders"
		_, err := p.Process(ctx, r)
		var gap *ordering.GapError
		require.ErrorAs(t, err, &gap)
		require.EqualValues(t, 2, gap.Want)
		processAll(t, p, 1, rec("o", 2, "a2"), rec("o", 3, "a3"))
		require.Equal(t, []int64{1, 2, 3}, e.seqs(t, "o"))
	})

	t.Run("GapIgnoreAppliesEverything", func(t *testing.T) {
		t.Parallel()
		p, e, _ := setup(t, mode{batch: 1}, func(c *consumer.Config) { c.GapPolicy = ordering.GapIgnore })
		res := processAll(t, p, 1, rec("o", 1, "a1"), rec("o", 3, "a3"), rec("o", 2, "a2"), rec("o", 2, "a2"))
		require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.Applied, consumer.Duplicate}, outcomes(res))
		require.Equal(t, []int64{1, 3, 2}, e.seqs(t, "o"))
	})

	t.Run("FirstSeenStrictParksUntilSequenceOne", func(t *testing.T) {
		t.Parallel()
		p, e, _ := setup(t, mode{batch: 1}, nil) // strict is the default
		res := processAll(t, p, 1, rec("o", 2, "a2"), rec("o", 1, "a1"))
		require.Equal(t, []consumer.Outcome{consumer.Parked, consumer.Applied}, outcomes(res))
		require.Equal(t, []int64{1, 2}, e.seqs(t, "o"))
	})

	t.Run("FirstSeenBaselineStartsWhereTheConsumerJoined", func(t *testing.T) {
		t.Parallel()
		p, e, _ := setup(t, mode{batch: 1}, func(c *consumer.Config) { c.FirstSeen = ordering.FirstSeenBaseline })
		res := processAll(t, p, 1, rec("o", 5, "a5"), rec("o", 6, "a6"), rec("o", 4, "a4"))
		require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Applied, consumer.Duplicate}, outcomes(res))
		require.Equal(t, []int64{5, 6}, e.seqs(t, "o"))
	})

	// Every record is produced once in each mode (one per transaction, in
	// batches through Handle, in batches through HandleBatch), with the same
	// disorder, duplicates, poison and bad input: the database must end up
	// the same.
	t.Run("BatchModeMatchesSingleMode", func(t *testing.T) {
		t.Parallel()
		stream := func() []*kgo.Record {
			var rs []*kgo.Record
			// Two batches (of 16) that reach the handlers on the happy
			// path: the first with a repeated key and records without a
			// sequence, the second with a poison record, which sends it
			// back one by one. Then disorder, which the happy path mostly
			// leaves to the fallback.
			next := map[string]int64{}
			clean := func(aggs ...string) {
				for _, agg := range aggs {
					next[agg]++
					rs = append(rs, rec(agg, next[agg], agg+"-"+strconvI(next[agg])))
				}
			}
			for range 3 {
				clean("c0", "c1", "c2", "c3")
			}
			rs = append(rs, rec("c0", 1, "c0-1"), rec("n", 0, "n1"), rec("n", 0, "n2"))
			clean("c1")
			for range 3 {
				clean("c0", "c1", "c2", "c3")
			}
			rs = append(rs, rec("q", 1, "q1"), rec("q", 2, "q2"), rec("n", 0, "n3"))
			clean("c0")
			for i := range 40 {
				agg := "a" + string(rune('0'+i%5))
				seq := int64(i/5 + 1)
				if i%7 == 3 && i+5 < 40 {
					seq++ // swap with the next of the aggregate below
				} else if i%7 == 3+5%7 {
					seq--
				}
				rs = append(rs, rec(agg, seq, agg+"-"+strconvI(seq)))
				if i%9 == 0 {
					rs = append(rs, rec(agg, seq, agg+"-"+strconvI(seq)))
				}
			}
			bad := rec("p", 1, "p1")
			rs = append(rs, bad, rec("p", 2, "p2"), &kgo.Record{Value: []byte("no key")})
			return rs
		}
		type state struct {
			effects []string
			letters []string
		}
		run := func(md mode, first ordering.FirstSeenPolicy) state {
			p, e, db := setup(t, md, func(c *consumer.Config) { c.FirstSeen = first })
			e.setFail("p", consumer.Permanent(errBroken))
			e.setFail("q", errBroken)
			processAll(t, p, md.batch, stream()...)
			if md.batchHandler {
				calls := e.batchKeys()
				require.GreaterOrEqual(t, len(calls), 2, "HandleBatch ran for the clean batches")
				require.Len(t, calls[0], 15, "all but the repeated key")
				require.Contains(t, calls[1], "q1")
			}
			rows, err := db.Pool.Query(ctx, `SELECT aggregate || ':' || seq FROM `+e.table+` ORDER BY n`)
			require.NoError(t, err)
			var s state
			for rows.Next() {
				var v string
				require.NoError(t, rows.Scan(&v))
				s.effects = append(s.effects, v)
			}
			require.NoError(t, rows.Err())
			ls, err := lettersOf(ctx, p, nil)
			require.NoError(t, err)
			for _, l := range ls {
				s.letters = append(s.letters, fmt.Sprintf("%s:%s:%d attempts", l.IdempotencyKey, strings.SplitN(l.Error, ":", 2)[0], l.Attempts))
			}
			return s
		}
		for _, first := range []ordering.FirstSeenPolicy{ordering.FirstSeenStrict, ordering.FirstSeenBaseline} {
			single := run(mode{batch: 1}, first)
			require.NotEmpty(t, single.effects)
			require.Equal(t, single, run(mode{batch: 16}, first))
			require.Equal(t, single, run(mode{batch: 16, batchHandler: true}, first))
			require.Len(t, single.letters, 3)
		}
	})
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	withHeader := func(name, value string) *kgo.Record {
		r := rec("o", 0, "k-"+name+value)
		for i, h := range r.Headers {
			if h.Key == name {
				r.Headers[i].Value = []byte(value)
				return r
			}
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: name, Value: []byte(value)})
		return r
	}
	tests := []struct {
		name    string
		rec     *kgo.Record
		wantErr string
	}{
		{"NoKey", &kgo.Record{Key: []byte("o"), Value: []byte("v")}, "no idempotency key"},
		{"NonNumericSeq", withHeader(outbox.HeaderAggregateSeq, "three"), "not a decimal integer"},
		{"NegativeSeq", withHeader(outbox.HeaderAggregateSeq, "-2"), "sequences start at 1"},
		{"ZeroSeq", withHeader(outbox.HeaderAggregateSeq, "0"), "sequences start at 1"},
		{"EmptySeq", withHeader(outbox.HeaderAggregateSeq, ""), "empty"},
		{"BadOccurredAt", withHeader(outbox.HeaderOccurredAt, "yesterday"), "not an RFC 3339 time"},
		{"KeyNotText", withHeader(outbox.HeaderIdempotencyKey, "k\xff\x00"), "not UTF-8 text"},
		{"HugeValue", func() *kgo.Record { r := rec("o", 1, "huge"); r.Value = make([]byte, 1<<20+1); return r }(), "exceeds Config.MaxValueBytes"},
		{"SeqWithoutAggregate", &kgo.Record{Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte("e")}, {Key: outbox.HeaderAggregateSeq, Value: []byte("1")}}}, "needs an aggregate id"},
	}
	db := pgtest.New(t, nil)
	e := newEffects(t, db)
	cfg := fastConfig(db, 1)
	cfg.MaxValueBytes = 1 << 20
	p, err := consumer.Handle(db.Pool, "svc", e, cfg)
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.rec.Topic = "orders"
			tt.rec.Offset = nextOffset.Add(1)
			tt.rec.Headers = append(tt.rec.Headers, kgo.RecordHeader{Key: "odd\x00\xfe", Value: []byte{0, 0xff}})
			res, err := p.Process(ctx, tt.rec)
			require.NoError(t, err)
			require.Equal(t, consumer.DeadLettered, res.Outcome)
			require.ErrorContains(t, res.Err, tt.wantErr)
			require.True(t, consumer.IsPermanent(res.Err))
			l, err := p.Inspector().Letter(ctx, res.DeadLetterID)
			require.NoError(t, err)
			require.Contains(t, l.Error, tt.wantErr)
			require.Equal(t, tt.rec.Value, l.Record.Value, "the whole record is kept")
			require.Equal(t, []byte{0, 0xff}, l.Record.Headers[len(l.Record.Headers)-1].Value)
		})
	}

	t.Run("KeyOrder", func(t *testing.T) {
		t.Parallel()
		var got []string
		h := consumer.HandlerFunc(func(_ context.Context, _ pgxTx, m *consumer.Message) error {
			got = append(got, m.IdempotencyKey)
			return nil
		})
		db := pgtest.New(t, nil)
		cfg := fastConfig(db, 1)
		cfg.KeyFunc = func(r *kgo.Record) (string, error) { return "fn-" + string(r.Value), nil }
		p, err := consumer.Handle(db.Pool, "svc", h, cfg)
		require.NoError(t, err)
		hs := func(kv ...string) []kgo.RecordHeader {
			var out []kgo.RecordHeader
			for i := 0; i < len(kv); i += 2 {
				out = append(out, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
			}
			return out
		}
		for _, r := range []*kgo.Record{
			{Value: []byte("1"), Headers: hs(outbox.HeaderDebeziumID, "dbz", outbox.HeaderEventID, "evt", outbox.HeaderIdempotencyKey, "idem")},
			{Value: []byte("2"), Headers: hs(outbox.HeaderDebeziumID, "dbz", outbox.HeaderEventID, "evt")},
			{Value: []byte("3"), Headers: hs(outbox.HeaderDebeziumID, "dbz")},
			{Value: []byte("4")},
		} {
			r.Topic = "t"
			r.Offset = nextOffset.Add(1)
			res, err := p.Process(ctx, r)
			require.NoError(t, err)
			require.Equal(t, consumer.Applied, res.Outcome)
		}
		require.Equal(t, []string{"idem", "evt", "dbz", "fn-4"}, got)
	})

	t.Run("MessageFields", func(t *testing.T) {
		t.Parallel()
		var got *consumer.Message
		h := consumer.HandlerFunc(func(_ context.Context, _ pgxTx, m *consumer.Message) error { got = m; return nil })
		db := pgtest.New(t, nil)
		p, err := consumer.Handle(db.Pool, "svc", h, fastConfig(db, 1))
		require.NoError(t, err)
		r := withHeader(outbox.HeaderOccurredAt, "2026-01-02T03:04:05.123456789Z")
		r.Topic = "orders"
		r.Offset = nextOffset.Add(1)
		_, err = p.Process(ctx, r)
		require.NoError(t, err)
		require.Equal(t, "k-"+outbox.HeaderOccurredAt+"2026-01-02T03:04:05.123456789Z", got.EventID)
		require.Equal(t, got.EventID, got.IdempotencyKey)
		require.Equal(t, "order.changed", got.EventType)
		require.Equal(t, "order", got.AggregateType)
		require.Equal(t, "o", got.AggregateID)
		require.False(t, got.HasSeq(), "no sequence header: 0, ordering bypassed")
		require.Empty(t, got.ContentType)
		require.Equal(t, 123456789, got.OccurredAt.Nanosecond())
		require.Equal(t, 1, got.Attempt)
		v, ok := got.Header(outbox.HeaderEventType)
		require.True(t, ok)
		require.Equal(t, "order.changed", string(v))
		_, ok = got.Header("traceparent")
		require.False(t, ok)
	})
}
