package consumer

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/internal/pgpipeline"
	"github.com/d419a114/outbox/ordering"
)

// ProcessBatch applies records of one partition, in offset order, each
// aggregate's records consecutive among that aggregate's (the Consumer
// passes consecutive records at Concurrency 1, and records of distinct
// aggregates or consecutive records of one above), with the same results as calling Process for each, but, on the
// happy path, in a single transaction: BEGIN and one multi-row claim of
// their keys in one round trip, one statement that moves all their
// aggregates' positions, the handler for each (or, when the handler is a
// BatchHandler, one HandleBatch for all), one commit.
//
// The happy path takes no savepoint per record (savepoints cost more than
// the records they protect). Instead, when anything is off the happy path
// (a handler error or panic, a gap, a duplicate sequence, parked successors
// to drain, a malformed record, a failed commit), the whole transaction is
// rolled back and the batch is run again record by record through Process,
// which retries, parks and dead-letters each record alone. Duplicate keys
// stay on the happy path: they are simply skipped. A record whose Handle
// failed in the batch counts that as its first attempt; a HandleBatch
// failure counts as no record's.
//
// Results are per record, in order. A non-nil error has the same meaning
// as Process's for the first record without a result: that record and the
// ones after it are not done and must be processed again; the results
// returned are those of the records before it.
//
// A routing Processor ([Config.Route]) splits recs by target and applies
// each target's records as above, in that target's transactions, one
// target after another; the records after the first one not done may be
// done already in their targets, and are skipped by dedupe when given
// again.
func (p *Processor) ProcessBatch(ctx context.Context, recs []*kgo.Record) ([]Result, error) {
	if p.route != nil {
		return p.route.processBatch(ctx, recs)
	}
	return p.tracedBatch(ctx, recs, p.processBatch)
}

func (p *Processor) processBatch(ctx context.Context, recs []*kgo.Record) ([]Result, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	if len(recs) > 1 {
		switch o := p.newBatchRun(recs).once(ctx); o.verdict {
		case batchApplied:
			return o.res, nil
		case batchNotDone:
			return nil, o.err
		case batchHandlerFailed:
			return p.fallback(ctx, recs, o.failed, o.err)
		}
	}
	return p.fallback(ctx, recs, nil, nil)
}

// fallback processes recs one by one. failed, when not nil, is the message
// whose Handle failed with ferr in the rolled-back batch: it counts as its
// first attempt.
func (p *Processor) fallback(ctx context.Context, recs []*kgo.Record, failed *Message, ferr error) ([]Result, error) {
	out := make([]Result, 0, len(recs))
	for _, r := range recs {
		var (
			res Result
			err error
		)
		if failed != nil && failed.Record == r {
			failed.Attempt = 0
			res, err = p.processAfter(ctx, failed, ferr)
		} else {
			res, err = p.processRecord(ctx, r)
		}
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// batchVerdict is how one try of the happy path ended.
type batchVerdict int

const (
	// batchApplied: the transaction committed; every record has its
	// result.
	batchApplied batchVerdict = iota
	// batchOffPath: rolled back because a record is off the happy path (a
	// malformed record, a hole or repeat in a sequence, a position that did
	// not move, parked successors, a transient handler error, a failed
	// commit). The caller goes one record at a time, blaming nobody.
	batchOffPath
	// batchHandlerFailed: rolled back because a handler failed with err;
	// failed is the message whose Handle failed, or nil when HandleBatch
	// did. The caller goes one record at a time, and that run counts as
	// failed's first attempt.
	batchHandlerFailed
	// batchNotDone: rolled back because the database failed or ctx ended
	// (err). Nothing is done; the records must be processed again.
	batchNotDone
)

// batchOutcome is a try's verdict with what goes with it.
type batchOutcome struct {
	verdict batchVerdict
	res     []Result
	failed  *Message
	err     error
}

var offPath = batchOutcome{verdict: batchOffPath}

func notDoneBatch(err error) batchOutcome { return batchOutcome{verdict: batchNotDone, err: err} }

// batchRun is one try of ProcessBatch's happy path, from the records to
// their handler: the records' messages, the transaction, and each
// record's result on the happy path. Each step is a method of it instead
// of a function passing the same values along. Only the goroutine applying
// the batch touches it.
type batchRun struct {
	p    *Processor
	recs []*kgo.Record
	// msgs are the records parsed, in order; their keys are claimed in tx.
	msgs []*Message
	tx   *pgpipeline.Tx
	// res is each message's result on the happy path (see planBatch).
	res []Result
}

// newBatchRun starts a try of the happy path for recs.
func (p *Processor) newBatchRun(recs []*kgo.Record) *batchRun { return &batchRun{p: p, recs: recs} }

// once tries the happy path for the batch, in named steps: parse the
// records, claim the keys with BEGIN, plan the position moves, move the
// positions, run the handlers, commit. Any step may end the try; see
// batchVerdict.
func (b *batchRun) once(ctx context.Context) batchOutcome {
	p := b.p
	keys, ok := b.parse()
	if !ok {
		return offPath
	}
	var freshKeys []string
	tx, release, err := pgpipeline.Begin(ctx, p.db, p.sql.ClaimMany, []any{p.name, keys}, &freshKeys)
	if err != nil {
		return notDoneBatch(infra(fmt.Errorf("consumer: begin and claim keys: %w", err)))
	}
	defer release()
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	defer track(ctx, p, tx)()
	b.tx = tx
	defer func() { b.tx = nil }()

	res, moves, ok := planBatch(b.msgs, freshKeys, p.ordered)
	if !ok {
		return offPath
	}
	b.res = res
	if ok, err := b.advance(ctx, moves); err != nil {
		return notDoneBatch(err)
	} else if !ok {
		return offPath
	}
	// Every position moved as one record at a time would have moved them,
	// so the handlers run in the same order with the same verdicts.
	if m, err := b.handleAll(ctx); err != nil {
		return b.handlerFailed(ctx, m, err)
	}
	if err := tx.Commit(ctx); err != nil {
		if ctx.Err() != nil {
			return notDoneBatch(ctx.Err())
		}
		return offPath
	}
	p.noteDuplicates(ctx, b.msgs, res)
	return batchOutcome{verdict: batchApplied, res: res}
}

// parse parses the records into b.msgs and returns their keys; ok false
// when one is malformed, which only the one-by-one path can dead-letter.
func (b *batchRun) parse() (keys []string, ok bool) {
	p := b.p
	msgs, keys := make([]*Message, len(b.recs)), make([]string, len(b.recs))
	for i, r := range b.recs {
		m, err := parse(r, p.cfg.KeyFunc, p.cfg.MaxValueBytes)
		if err != nil {
			return nil, false
		}
		m.Attempt = 1
		msgs[i], keys[i] = m, m.IdempotencyKey
	}
	b.msgs = msgs
	return keys, true
}

// aggregateMove is one aggregate's records in a batch: sequences first to
// last without a hole.
type aggregateMove struct {
	agg         ordering.Aggregate
	first, last int64
}

// planBatch gives each message its result on the happy path (Duplicate
// when its key was not fresh; a key repeated in the batch is fresh at its
// first place only) and the moves of the aggregates of the fresh ones, in
// order of first appearance. ok false when an aggregate's fresh records
// are not consecutive.
func planBatch(msgs []*Message, freshKeys []string, ordered func(*Message) bool) ([]Result, []aggregateMove, bool) {
	fresh := make(map[string]bool, len(freshKeys))
	for _, k := range freshKeys {
		fresh[k] = true
	}
	res := make([]Result, len(msgs))
	at := map[ordering.Aggregate]int{}
	var moves []aggregateMove
	for i, m := range msgs {
		if !fresh[m.IdempotencyKey] {
			res[i] = Result{Outcome: Duplicate}
			continue
		}
		delete(fresh, m.IdempotencyKey)
		res[i] = Result{Outcome: Applied, Attempts: 1}
		if !ordered(m) {
			continue
		}
		agg := m.aggregate()
		j, seen := at[agg]
		switch {
		case !seen:
			at[agg] = len(moves)
			moves = append(moves, aggregateMove{agg: agg, first: m.Seq, last: m.Seq})
		case m.Seq == moves[j].last+1:
			moves[j].last = m.Seq
		default:
			return nil, nil, false // a hole or a repeat: one by one
		}
	}
	return res, moves, true
}

// advance moves every aggregate of moves in b.tx, in one statement. ok
// false when one did not move as planned (a gap, a duplicate sequence, an
// aggregate not seen before under FirstSeenStrict) or has parked records
// to drain.
func (b *batchRun) advance(ctx context.Context, moves []aggregateMove) (bool, error) {
	p := b.p
	if len(moves) == 0 {
		return true, nil
	}
	types, ids := make([]string, len(moves)), make([]string, len(moves))
	firsts, lasts := make([]int64, len(moves)), make([]int64, len(moves))
	for i, mv := range moves {
		types[i], ids[i], firsts[i], lasts[i] = mv.agg.Type, mv.agg.ID, mv.first, mv.last
	}
	var moved, parked int64
	err := b.tx.QueryRow(ctx, p.sql.AdvanceMany, p.name, types, ids, firsts, lasts,
		p.cfg.FirstSeen == ordering.FirstSeenBaseline).Scan(&moved, &parked)
	if err != nil {
		return false, infra(fmt.Errorf("consumer: advance positions: %w", err))
	}
	return moved == int64(len(moves)) && parked == 0, nil
}

// handlerFailed says what a handler's error m, err in the batch means.
func (b *batchRun) handlerFailed(ctx context.Context, m *Message, err error) batchOutcome {
	if ctx.Err() != nil {
		return notDoneBatch(ctx.Err())
	}
	// connectionLost wraps err when, and only when, the connection is gone.
	if lost := connectionLost(b.tx, err); lost != err { //nolint:errorlint // identity: did connectionLost wrap err?
		// The database went away under the handler: that says nothing
		// about the records and must not count as a try.
		return notDoneBatch(lost)
	}
	if c := classify(err); c == classTransient || c == classSuspect {
		// A deadlock, a lock timeout, a pooler's lost statement: which
		// record is at fault, if any, the batch cannot say; one by one,
		// each is tried afresh and judged alone.
		return offPath
	}
	return batchOutcome{verdict: batchHandlerFailed, failed: m, err: err}
}
