package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ProcessBatch applies consecutive records of one partition (in offset
// order) with the same results as calling Process for each, but, on the
// happy path, in a single transaction: one multi-row claim of their keys,
// one pipelined round trip that moves their aggregates' positions, the
// handler for each, one commit.
//
// The happy path takes no savepoint per record (savepoints cost more than
// the records they protect). Instead, when anything is off the happy path
// (a handler error or panic, a gap, a duplicate sequence, parked successors
// to drain, a malformed record, a failed commit), the whole transaction is
// rolled back and the batch is run again record by record through Process,
// which retries, parks and dead-letters each record alone. Duplicate keys
// stay on the happy path: they are simply skipped.
//
// Results are per record, in order. A non-nil error has the same meaning
// as Process's for the first record without a result: that record and the
// ones after it are not done and must be processed again; the results
// returned are those of the records before it.
func (p *Processor) ProcessBatch(ctx context.Context, recs []*kgo.Record) ([]Result, error) {
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
		if failed != nil {
			return p.fallback(ctx, recs, failed, ferr)
		}
	}
	return p.fallback(ctx, recs, nil, nil)
}

// fallback processes recs one by one. failed, when not nil, is the message
// whose handler failed with ferr in the rolled-back batch: it counts as its
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
			res, err = p.Process(ctx, r)
		}
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// batchOnce tries the happy path. ok false (with a nil error) means the
// transaction was rolled back and the caller must fall back; failed and
// ferr then name the message whose handler failed, if one did.
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
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return nil, false, nil, nil, fmt.Errorf("consumer: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	fresh, err := p.dedupe.ClaimMany(ctx, tx, keys)
	if err != nil {
		return nil, false, nil, nil, err
	}
	res := make([]Result, len(recs))
	var b pgx.Batch
	var sequenced []int
	for i, m := range msgs {
		if !fresh[i] {
			res[i] = Result{Outcome: Duplicate}
			continue
		}
		res[i] = Result{Outcome: Applied, Attempts: 1}
		if m.HasSeq() {
			sql, args := p.ordering.AdvanceSQL(m.aggregate(), m.Seq)
			b.Queue(sql, args...)
			sequenced = append(sequenced, i)
		}
	}
	if len(sequenced) > 0 {
		// All positions move in one round trip, in record order, before the
		// handlers run: if every move is the hot path's "next in line", the
		// handlers run in the same order as they would one by one.
		br := tx.SendBatch(ctx, &b)
		inLine := true
		for range sequenced {
			var parked int
			err := br.QueryRow().Scan(&parked)
			if errors.Is(err, pgx.ErrNoRows) || (err == nil && parked > 0) {
				inLine = false
				continue
			}
			if err != nil {
				_ = br.Close()
				return nil, false, nil, nil, fmt.Errorf("consumer: advance positions: %w", err)
			}
		}
		if err := br.Close(); err != nil {
			return nil, false, nil, nil, fmt.Errorf("consumer: advance positions: %w", err)
		}
		if !inLine {
			return nil, false, nil, nil, nil
		}
	}
	for i, m := range msgs {
		if res[i].Outcome != Applied {
			continue
		}
		if err := p.call(ctx, tx, m); err != nil {
			if ctx.Err() != nil {
				return nil, false, nil, nil, ctx.Err()
			}
			return nil, false, m, err, nil
		}
	}
	if err := tx.Commit(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, false, nil, nil, ctx.Err()
		}
		return nil, false, nil, nil, nil
	}
	return res, true, nil, nil, nil
}
