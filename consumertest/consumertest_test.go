package consumertest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/consumertest"
	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/ordering"
	"github.com/d419a114/outbox/producer"
)

// event builds a record of the wire contract: aggregate account/agg at seq
// (none when 0), keyed by key, worth amount.
func event(agg string, seq int64, key string, amount int) *kgo.Record {
	return producer.Record("", producer.Event{AggregateType: "account", AggregateID: agg, EventType: "deposit", Payload: []byte(strconv.Itoa(amount))},
		producer.Stamp{EventID: key, Seq: seq})
}

// samples are three accounts' events and two without a sequence.
func samples() []*kgo.Record {
	var out []*kgo.Record
	for _, agg := range []string{"x", "y", "z"} {
		for s := int64(1); s <= 4; s++ {
			out = append(out, event(agg, s, fmt.Sprintf("%s-%d", agg, s), int(s)*10))
		}
	}
	return append(out, event("x", 0, "plain-1", 1), event("y", 0, "plain-2", 2))
}

// ledger is a handler under test: one row per event in table.
type ledger struct {
	table string
	// pool, when set, is where Handle writes instead of tx: the bug of
	// writing outside the transaction.
	pool *pgxpool.Pool
	// seen, when set, makes Handle skip a key it has handled before: the
	// bug of keeping state across tries.
	seen map[string]bool
	// perTx, when set, adds to each amount the rows its transaction wrote
	// before: the bug of an effect that depends on the transaction.
	perTx bool
}

func (l ledger) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if l.seen != nil {
		if l.seen[m.IdempotencyKey] {
			return nil
		}
		l.seen[m.IdempotencyKey] = true
	}
	amount, err := strconv.Atoi(string(m.Value))
	if err != nil {
		return consumer.Permanent(err)
	}
	q := `INSERT INTO ` + l.table + ` (event_id, account, seq, amount) VALUES ($1, $2, $3, $4)`
	if l.perTx {
		q = `INSERT INTO ` + l.table + ` (event_id, account, seq, amount)
SELECT $1, $2, $3, $4 + count(*) FROM ` + l.table + ` WHERE xmin = pg_current_xact_id()::xid`
	}
	if l.pool != nil {
		_, err = l.pool.Exec(ctx, q, m.IdempotencyKey, m.AggregateID, m.Seq, amount)
	} else {
		_, err = tx.Exec(ctx, q, m.IdempotencyKey, m.AggregateID, m.Seq, amount)
	}
	return err
}

// batchLedger is ledger as a BatchHandler; factor multiplies the amounts
// HandleBatch writes and dropLast leaves a batch's last message out, both
// bugs when not 1 and false.
type batchLedger struct {
	ledger
	factor   int
	dropLast bool
}

func (l batchLedger) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
	if l.dropLast {
		ms = ms[:len(ms)-1]
	}
	keys, accounts, seqs, amounts := []string{}, []string{}, []int64{}, []int{}
	for _, m := range ms {
		a, err := strconv.Atoi(string(m.Value))
		if err != nil {
			return err
		}
		keys, accounts, seqs, amounts = append(keys, m.IdempotencyKey), append(accounts, m.AggregateID), append(seqs, m.Seq), append(amounts, a*l.factor)
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+l.table+` (event_id, account, seq, amount)
SELECT k, a, s, n FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[]) WITH ORDINALITY AS u (k, a, s, n, o) ORDER BY o`, keys, accounts, seqs, amounts)
	return err
}

type bundle struct {
	db    *pgtest.DB
	table string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.New(t, nil)
	b := &bundle{db: db, table: db.Table("ledger")}
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+b.table+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id text NOT NULL, account text NOT NULL, seq bigint NOT NULL, amount int NOT NULL)`)
	require.NoError(t, err)
	return b
}

// config is a Config for h on b's database, with Reset, Applied and a
// State of the balances.
func (b *bundle) config(h consumer.Handler) consumertest.Config {
	return consumertest.Config{
		DB: b.db.Pool, Handler: h, Records: samples(), Runs: 5,
		Reset: func(ctx context.Context, db *pgxpool.Pool) error {
			_, err := db.Exec(ctx, `TRUNCATE `+b.table)
			return err
		},
		Applied: func(ctx context.Context, db *pgxpool.Pool) ([]string, error) {
			rows, _ := db.Query(ctx, `SELECT event_id FROM `+b.table+` ORDER BY id`)
			return pgx.CollectRows(rows, pgx.RowTo[string])
		},
		State: func(ctx context.Context, db *pgxpool.Pool) (any, error) {
			rows, _ := db.Query(ctx, `SELECT account || '=' || sum(amount) FROM `+b.table+` GROUP BY account ORDER BY account`)
			return pgx.CollectRows(rows, pgx.RowTo[string])
		},
	}
}

func failure(t *testing.T, err error) *consumertest.Failure {
	t.Helper()
	var f *consumertest.Failure
	require.ErrorAs(t, err, &f)
	require.NotZero(t, f.Seed)
	require.NotEmpty(t, f.Schedule)
	require.Contains(t, f.Error(), "OUTBOX_CONSUMERTEST_SEED="+strconv.FormatUint(f.Seed, 10))
	return f
}

func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PassesACorrectHandler", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		consumertest.Run(t, b.config(ledger{table: b.table}))
	})

	t.Run("PassesACorrectBatchHandler", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		consumertest.Run(t, b.config(batchLedger{ledger: ledger{table: b.table}, factor: 1}))
	})

	t.Run("PassesWithAggregatesStartingAbove1AndFirstSeenBaseline", func(t *testing.T) {
		t.Parallel()
		for _, fs := range []ordering.FirstSeenPolicy{ordering.FirstSeenStrict, ordering.FirstSeenBaseline} {
			b := setup(t)
			cfg := b.config(ledger{table: b.table})
			cfg.Records = []*kgo.Record{event("x", 7, "x-7", 1), event("x", 8, "x-8", 2), event("y", 1, "y-1", 3), event("y", 2, "y-2", 4)}
			cfg.Consumer = &consumer.Config{FirstSeen: fs, MaxAttempts: 3}
			cfg.Schema = "consumertest_own_" + strconv.Itoa(int(fs))
			consumertest.Run(t, cfg)
		}
	})

	// A handler that writes with the pool instead of its transaction
	// keeps the effect of a try that was rolled back.
	t.Run("FailsAHandlerThatWritesOutsideItsTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := failure(t, consumertest.Check(ctx, b.config(ledger{table: b.table, pool: b.db.Pool})))
		require.Contains(t, f.Problem, "times: does the handler write outside the transaction")
	})

	t.Run("FailsAHandlerThatKeepsStateAcrossTries", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := failure(t, consumertest.Check(ctx, b.config(ledger{table: b.table, seen: map[string]bool{}})))
		require.Contains(t, f.Problem, "is missing from Applied, although its transaction committed")
	})

	t.Run("FailsAHandleBatchThatDropsAMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := failure(t, consumertest.Check(ctx, b.config(batchLedger{ledger: ledger{table: b.table}, factor: 1, dropLast: true})))
		require.Equal(t, "ProcessBatch", f.Mode)
		require.Contains(t, f.Problem, "is missing from Applied")
	})

	t.Run("FailsAHandleBatchWithAnotherEffectThanHandle", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := failure(t, consumertest.Check(ctx, b.config(batchLedger{ledger: ledger{table: b.table}, factor: 2})))
		require.Equal(t, "both", f.Mode)
		require.Contains(t, f.Problem, "HandleBatch must have exactly the effect of Handle")
	})

	t.Run("FailsEffectsOutOfOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.config(ledger{table: b.table})
		applied := cfg.Applied
		cfg.Applied = func(ctx context.Context, db *pgxpool.Pool) ([]string, error) {
			keys, err := applied(ctx, db)
			slices.Reverse(keys)
			return keys, err
		}
		f := failure(t, consumertest.Check(ctx, cfg))
		require.Contains(t, f.Problem, "effects out of sequence order")
	})

	t.Run("FailsARecordTheHandlerAlwaysRefuses", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.config(ledger{table: b.table})
		cfg.Records = append(cfg.Records, event("z", 5, "z-5", 0))
		cfg.Records[len(cfg.Records)-1].Value = []byte("not a number")
		f := failure(t, consumertest.Check(ctx, cfg))
		require.Contains(t, f.Problem, "still dead-lettered after its replay")
		require.Contains(t, f.Problem, "invalid syntax")
	})

	// A plain handler whose effect depends on its transaction differs
	// between Process and ProcessBatch; the report must not talk of a
	// HandleBatch it does not have.
	t.Run("FailsAPlainHandlerWhoseEffectDependsOnItsTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.config(ledger{table: b.table, perTx: true})
		cfg.Seed = 1
		f := failure(t, consumertest.Check(ctx, cfg))
		require.Equal(t, "both", f.Mode)
		require.Contains(t, f.Problem, "ProcessBatch calls Handle for several messages in one transaction")
		require.NotContains(t, f.Problem, "HandleBatch")
	})

	t.Run("PassesRecordsFromEvents", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.config(ledger{table: b.table})
		var events []producer.Event
		for i := range 9 {
			events = append(events, producer.Event{AggregateType: "account", AggregateID: []string{"x", "y", "z"}[i%3], EventType: "deposit", Payload: []byte(strconv.Itoa(i))})
		}
		cfg.Records = consumertest.Records(events...)
		consumertest.Run(t, cfg)
	})

	t.Run("TheSeedReplaysTheSchedule", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.config(ledger{table: b.table, pool: b.db.Pool})
		first := failure(t, consumertest.Check(ctx, cfg))
		cfg.Seed, cfg.Runs = first.Seed, 1
		again := failure(t, consumertest.Check(ctx, cfg))
		require.Equal(t, first.Seed, again.Seed)
		require.Equal(t, first.Schedule, again.Schedule)
		require.Equal(t, first.Problem, again.Problem)
	})
}

func TestCheckValidatesConfig(t *testing.T) {
	t.Parallel()
	ok := consumertest.Config{
		DSN: "postgres://unused", Handler: ledger{}, Records: samples(),
		Reset:   func(context.Context, *pgxpool.Pool) error { return nil },
		Applied: func(context.Context, *pgxpool.Pool) ([]string, error) { return nil, nil },
	}
	for name, tc := range map[string]struct {
		mod  func(*consumertest.Config)
		want string
	}{
		"NoDatabase":   {func(c *consumertest.Config) { c.DSN = "" }, "needs DB or DSN"},
		"NoHandler":    {func(c *consumertest.Config) { c.Handler = nil }, "needs the Handler"},
		"NoRecords":    {func(c *consumertest.Config) { c.Records = nil }, "needs sample Records"},
		"NoReset":      {func(c *consumertest.Config) { c.Reset = nil }, "needs Reset"},
		"NoApplied":    {func(c *consumertest.Config) { c.Applied = nil }, "needs Applied"},
		"NegativeRuns": {func(c *consumertest.Config) { c.Runs = -1 }, "negative"},
		"SharedEventID": {func(c *consumertest.Config) {
			c.Records = []*kgo.Record{event("x", 1, "k", 1), event("y", 1, "k", 2)}
		}, `Records[0] and Records[1] share the idempotency key "k"`},
		"SeqZero": {func(c *consumertest.Config) {
			r := event("x", 1, "x-1", 1)
			setHeader(r, outbox.HeaderAggregateSeq, "0")
			c.Records = []*kgo.Record{event("y", 1, "y-1", 1), r}
		}, `Records[1]: header outbox-aggregate-seq is "0", but sequences are decimal numbers from 1`},
		"SeqNotANumber": {func(c *consumertest.Config) {
			r := event("x", 1, "x-1", 1)
			setHeader(r, outbox.HeaderAggregateSeq, "one")
			c.Records = []*kgo.Record{r}
		}, `Records[0]: header outbox-aggregate-seq is "one"`},
		"SeqWithoutAggregateID": {func(c *consumertest.Config) {
			r := event("", 1, "k", 1)
			c.Records = []*kgo.Record{r}
		}, "Records[0]: header outbox-aggregate-seq is \"1\", but the record has no aggregate id"},
		"NoKey": {func(c *consumertest.Config) {
			r := event("x", 1, "", 1)
			c.Records = []*kgo.Record{r}
		}, "Records[0]: no idempotency key"},
		"Hole": {func(c *consumertest.Config) {
			c.Records = []*kgo.Record{event("x", 1, "x-1", 1), event("x", 3, "x-3", 3)}
		}, "Records[1] is account/x seq 3, after Records[0] at seq 1: give each aggregate's records in sequence order without a hole"},
		"OutOfOrder": {func(c *consumertest.Config) {
			c.Records = []*kgo.Record{event("x", 2, "x-2", 1), event("x", 1, "x-1", 3)}
		}, "Records[1] is account/x seq 1, after Records[0] at seq 2"},
		"NilRecord": {func(c *consumertest.Config) { c.Records = []*kgo.Record{nil} }, "Records[0] is nil"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := ok
			tc.mod(&cfg)
			err := consumertest.Check(context.Background(), cfg)
			require.ErrorContains(t, err, tc.want)
			var f *consumertest.Failure
			require.False(t, errors.As(err, &f), "a configuration error is no Failure")
		})
	}
}

// setHeader sets the named header of r to v.
func setHeader(r *kgo.Record, name, v string) {
	for i := range r.Headers {
		if r.Headers[i].Key == name {
			r.Headers[i].Value = []byte(v)
			return
		}
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: name, Value: []byte(v)})
}

func TestRecords(t *testing.T) {
	t.Parallel()
	ev := func(typ, id string) producer.Event {
		return producer.Event{AggregateType: typ, AggregateID: id, EventType: "e", Payload: []byte(typ + id)}
	}
	recs := consumertest.Records(ev("a", "1"), ev("b", "1"), ev("a", "1"), ev("a", "2"), ev("a", "1"))
	seqs := map[string]bool{}
	ids := map[string]bool{}
	for i, r := range recs {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		seqs[h[outbox.HeaderAggregateType]+"/"+h[outbox.HeaderAggregateID]+":"+h[outbox.HeaderAggregateSeq]] = true
		id := h[outbox.HeaderEventID]
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id, "a UUIDv7")
		require.Equal(t, id, h[outbox.HeaderIdempotencyKey])
		ids[id] = true
		require.Equal(t, int64(i), r.Offset)
		require.Equal(t, int32(0), r.Partition)
		require.Equal(t, h[outbox.HeaderAggregateType], r.Topic)
		require.Equal(t, producer.Record(r.Topic, producer.Event{AggregateType: h[outbox.HeaderAggregateType], AggregateID: h[outbox.HeaderAggregateID],
			EventType: "e", Payload: r.Value}, producer.Stamp{EventID: id, Seq: int64(mustAtoi(t, h[outbox.HeaderAggregateSeq])), OccurredAt: r.Timestamp}).Headers, r.Headers,
			"producer.Record's record")
	}
	require.Len(t, ids, len(recs), "every event its own id")
	require.Equal(t, map[string]bool{"a/1:1": true, "b/1:1": true, "a/1:2": true, "a/2:1": true, "a/1:3": true}, seqs,
		"numbered 1, 2, 3 per aggregate type and id, in argument order")
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}
