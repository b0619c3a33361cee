package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/ordering"
)

// ProcessBatch applies consecutive records of one partition (in offset
// order) with the same results as calling Process for each, but, on the
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
func (p *Processor) ProcessBatch(ctx context.Context, recs []*kgo.Record) ([]Result, error) {
	res, err := p.processBatch(ctx, recs)
	p.report(ctx, recs, res, err)
	return res, err
}

// report tells the hooks what became of recs: res for the first len(res),
// err for the next one.
func (p *Processor) report(ctx context.Context, recs []*kgo.Record, res []Result, err error) {
	if p.cfg.Hooks == nil {
		return
	}
	for i, r := range res {
		p.cfg.Hooks.OnRecord(ctx, recs[i], r, nil)
	}
	if err != nil && len(res) < len(recs) {
		p.cfg.Hooks.OnRecord(ctx, recs[len(res)], Result{}, err)
	}
}

// tryBatch is ProcessBatch's happy path alone, for records of several
// partitions (each partition's in offset order): all of recs applied in one
// transaction (ok), or nothing done. ferr then says why, if a handler
// failed, for processBatchAfter: failed is the message whose Handle failed,
// or nil when HandleBatch did.
func (p *Processor) tryBatch(ctx context.Context, recs []*kgo.Record) (ok bool, failed *Message, ferr error) {
	res, ok, failed, ferr, err := p.batchOnce(ctx, recs)
	if err != nil || !ok {
		return false, failed, ferr
	}
	p.report(ctx, recs, res, nil)
	return true, nil, nil
}

// processBatchAfter is ProcessBatch for recs after a tryBatch whose
// handler failed with ferr: the records are processed one by one. failed,
// when it is one of recs, is the message whose Handle failed, and that run
// counts as its first attempt; a HandleBatch failure (failed nil) counts as
// no record's.
func (p *Processor) processBatchAfter(ctx context.Context, recs []*kgo.Record, failed *Message, ferr error) ([]Result, error) {
	res, err := p.fallback(ctx, recs, failed, ferr)
	p.report(ctx, recs, res, err)
	return res, err
}

func (p *Processor) processBatch(ctx context.Context, recs []*kgo.Record) ([]Result, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	if len(recs) > 1 {
		res, ok, failed, ferr, err := p.batchOnce(ctx, recs)
		if err != nil {
			return nil, err
		}
		if ok {
			return res, nil
		}
		return p.fallback(ctx, recs, failed, ferr)
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

// batchOnce tries the happy path. ok false (with a nil error) means the
// transaction was rolled back and the caller must fall back; ferr then
// says why, if a handler failed: failed is the message whose Handle failed,
// or nil when HandleBatch did (no record to blame).
func (p *Processor) batchOnce(ctx context.Context, recs []*kgo.Record) (_ []Result, ok bool, failed *Message, ferr error, _ error) {
	msgs := make([]*Message, len(recs))
	keys := make([]string, len(recs))
	for i, r := range recs {
		m, err := parse(r, p.cfg.KeyFunc, p.cfg.MaxValueBytes)
		if err != nil {
			return nil, false, nil, nil, nil
		}
		m.Attempt = 1
		msgs[i], keys[i] = m, m.IdempotencyKey
	}

	var freshKeys []string
	tx, release, err := beginWith(ctx, p.db, p.sql.ClaimMany, []any{p.name, keys}, &freshKeys)
	if err != nil {
		return nil, false, nil, nil, infra(fmt.Errorf("consumer: begin and claim keys: %w", err))
	}
	defer release()
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	defer p.track(tx)()

	// A key repeated in the batch is fresh at its first place only.
	fresh := make(map[string]bool, len(freshKeys))
	for _, k := range freshKeys {
		fresh[k] = true
	}
	type run struct{ first, last int64 }
	var (
		res   = make([]Result, len(recs))
		runs  = map[ordering.Aggregate]*run{}
		order []ordering.Aggregate
	)
	for i, m := range msgs {
		if !fresh[m.IdempotencyKey] {
			res[i] = Result{Outcome: Duplicate}
			continue
		}
		delete(fresh, m.IdempotencyKey)
		res[i] = Result{Outcome: Applied, Attempts: 1}
		if !m.HasSeq() {
			continue
		}
		agg := m.aggregate()
		r := runs[agg]
		switch {
		case r == nil:
			runs[agg] = &run{first: m.Seq, last: m.Seq}
			order = append(order, agg)
		case m.Seq == r.last+1:
			r.last = m.Seq
		default:
			return nil, false, nil, nil, nil // a hole or a repeat: one by one
		}
	}
	if len(order) > 0 {
		types, ids := make([]string, len(order)), make([]string, len(order))
		firsts, lasts := make([]int64, len(order)), make([]int64, len(order))
		for i, agg := range order {
			types[i], ids[i], firsts[i], lasts[i] = agg.Type, agg.ID, runs[agg].first, runs[agg].last
		}
		var moved, parked int64
		err := tx.QueryRow(ctx, p.sql.AdvanceMany, p.name, types, ids, firsts, lasts,
			p.cfg.FirstSeen == ordering.FirstSeenBaseline).Scan(&moved, &parked)
		if err != nil {
			return nil, false, nil, nil, infra(fmt.Errorf("consumer: advance positions: %w", err))
		}
		if moved != int64(len(order)) || parked > 0 {
			return nil, false, nil, nil, nil
		}
	}
	// Every position moved as one record at a time would have moved them,
	// so the handlers run in the same order with the same verdicts.
	if m, err := p.handleAll(ctx, tx, msgs, res); err != nil {
		if ctx.Err() != nil {
			return nil, false, nil, nil, ctx.Err()
		}
		var te *HandlerTimeoutError
		if tx.Conn().IsClosed() && !errors.As(err, &te) {
			// The database went away under the handler: that says
			// nothing about the records and must not count as a try.
			return nil, false, nil, nil, infra(fmt.Errorf("consumer: handler lost its connection: %w", err))
		}
		if classify(err) == classTransient {
			// A deadlock, a lock timeout: not the records' fault, so
			// no record is blamed; one by one, each is tried afresh.
			return nil, false, nil, nil, nil
		}
		return nil, false, m, err, nil
	}
	if err := tx.Commit(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, false, nil, nil, ctx.Err()
		}
		return nil, false, nil, nil, nil
	}
	return res, true, nil, nil, nil
}
