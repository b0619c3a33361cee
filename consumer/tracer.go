package consumer

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Tracer observes records being processed, for tracing and metrics
// adapters, in the manner of pgx's QueryTracer: a start that returns the
// context to go on in, and an end with the outcome. The Processor finds
// out once, in Handle, whether it is also a BatchTracer. Implementations
// must be safe for concurrent use and fast: they run on the goroutine that
// applies the record. Tracers combines several into one.
type Tracer interface {
	// TraceRecordStart is called when Process or ProcessBatch takes rec.
	// Process runs the record's transactions, and the handler, in the
	// context it returns, so that a span started here wraps them.
	TraceRecordStart(ctx context.Context, rec *kgo.Record) context.Context
	// TraceRecordEnd is called once for each TraceRecordStart, with the
	// context it returned, when the Processor is done with rec (err nil;
	// res says how: applied, duplicate, parked, dead-lettered) or hands it
	// back not done (err not nil, as Process returns it).
	TraceRecordEnd(ctx context.Context, rec *kgo.Record, res Result, err error)
}

// BatchTracer is a Tracer that also observes ProcessBatch's batches.
// TraceBatchStart is called before the records' TraceRecordStart, which get
// the context it returns; the batch's transactions and handlers run in that
// context. TraceBatchEnd is called after the records' TraceRecordEnd, with
// the results and error ProcessBatch returns.
type BatchTracer interface {
	Tracer
	TraceBatchStart(ctx context.Context, recs []*kgo.Record) context.Context
	TraceBatchEnd(ctx context.Context, recs []*kgo.Record, res []Result, err error)
}

// traced runs process for rec between the tracer's start and end.
func (p *Processor) traced(ctx context.Context, rec *kgo.Record, process func(context.Context, *kgo.Record) (Result, error)) (Result, error) {
	if p.tracer == nil {
		res, err := process(ctx, rec)
		p.count(res)
		return res, err
	}
	ctx = p.tracer.TraceRecordStart(ctx, rec)
	res, err := process(ctx, rec)
	p.count(res)
	p.tracer.TraceRecordEnd(ctx, rec, res, err)
	return res, err
}

// count adds the records res applied (its own and those it drained) to
// the Processor's count, which the Consumer's heartbeat reports.
func (p *Processor) count(res ...Result) {
	n := 0
	for _, r := range res {
		if r.Outcome == Applied {
			n++
		}
		n += r.Drained
	}
	if n > 0 {
		p.applied.Add(int64(n))
	}
}

// tracedBatch runs process for recs between the tracers' starts and ends:
// the batch's around its records'. A record after those with a result ends
// with err: it is handed back not done.
func (p *Processor) tracedBatch(ctx context.Context, recs []*kgo.Record, process func(context.Context, []*kgo.Record) ([]Result, error)) ([]Result, error) {
	if p.tracer == nil {
		res, err := process(ctx, recs)
		p.count(res...)
		return res, err
	}
	if p.batchTracer != nil {
		ctx = p.batchTracer.TraceBatchStart(ctx, recs)
	}
	rctx := make([]context.Context, len(recs))
	for i, r := range recs {
		rctx[i] = p.tracer.TraceRecordStart(ctx, r)
	}
	res, err := process(ctx, recs)
	p.count(res...)
	for i, r := range recs {
		if i < len(res) {
			p.tracer.TraceRecordEnd(rctx[i], r, res[i], nil)
		} else {
			p.tracer.TraceRecordEnd(rctx[i], r, Result{}, err)
		}
	}
	if p.batchTracer != nil {
		p.batchTracer.TraceBatchEnd(ctx, recs, res, err)
	}
	return res, err
}
