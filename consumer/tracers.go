package consumer

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Tracers returns one Tracer that calls each of ts, for a consumer traced
// and measured at once (outboxotel's tracer and outboxprom's metrics,
// say). It is a BatchTracer when one of ts is, and its batch hooks reach
// those of ts that are. Starts run in the order of ts, each in the context
// the one before returned, and the work runs in the last one's; ends run
// in the reverse order, each with the context its own start returned. Nil
// tracers are left out, and a result of Tracers among ts counts as its own
// tracers. Tracers returns nil for no tracer, and the tracer itself for
// one.
func Tracers(ts ...Tracer) Tracer {
	var m multiTracer
	for _, t := range ts {
		m.add(t)
	}
	switch {
	case len(m.record) == 0:
		return nil
	case len(m.record) == 1:
		return m.record[0]
	case len(m.batch) > 0:
		return &multiBatchTracer{m}
	}
	return &m
}

// multiTracer is what Tracers returns when none of its tracers is a
// BatchTracer: its tracers, and those that are BatchTracers.
type multiTracer struct {
	record []Tracer
	batch  []BatchTracer
}

// multiBatchTracer is what Tracers returns when one of its tracers is a
// BatchTracer.
type multiBatchTracer struct{ multiTracer }

var _ BatchTracer = (*multiBatchTracer)(nil)

func (m *multiTracer) add(t Tracer) {
	switch t := t.(type) {
	case nil:
		return
	case *multiTracer:
		for _, inner := range t.record {
			m.add(inner)
		}
		return
	case *multiBatchTracer:
		for _, inner := range t.record {
			m.add(inner)
		}
		return
	}
	m.record = append(m.record, t)
	if b, ok := t.(BatchTracer); ok {
		m.batch = append(m.batch, b)
	}
}

// recordStartedKey and batchStartedKey key, in the context a start of m
// returns, the contexts its tracers' starts returned, one per tracer.
type (
	recordStartedKey struct{ m *multiTracer }
	batchStartedKey  struct{ m *multiTracer }
)

// started returns the context each of n tracers' starts returned, from
// ctx that a start of the fan-out returned under key; ctx itself for each
// when it is not one.
func started(ctx context.Context, key any, n int) []context.Context {
	if ctxs, ok := ctx.Value(key).([]context.Context); ok && len(ctxs) == n {
		return ctxs
	}
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctxs[i] = ctx
	}
	return ctxs
}

// TraceRecordStart calls each tracer's TraceRecordStart.
func (m *multiTracer) TraceRecordStart(ctx context.Context, rec *kgo.Record) context.Context {
	ctxs := make([]context.Context, len(m.record))
	for i, t := range m.record {
		ctx = t.TraceRecordStart(ctx, rec)
		ctxs[i] = ctx
	}
	return context.WithValue(ctx, recordStartedKey{m}, ctxs)
}

// TraceRecordEnd calls each tracer's TraceRecordEnd, the last started
// first.
func (m *multiTracer) TraceRecordEnd(ctx context.Context, rec *kgo.Record, res Result, err error) {
	ctxs := started(ctx, recordStartedKey{m}, len(m.record))
	for i := len(m.record) - 1; i >= 0; i-- {
		m.record[i].TraceRecordEnd(ctxs[i], rec, res, err)
	}
}

// TraceBatchStart calls TraceBatchStart of each tracer that is a
// BatchTracer.
func (m *multiBatchTracer) TraceBatchStart(ctx context.Context, recs []*kgo.Record) context.Context {
	ctxs := make([]context.Context, len(m.batch))
	for i, t := range m.batch {
		ctx = t.TraceBatchStart(ctx, recs)
		ctxs[i] = ctx
	}
	return context.WithValue(ctx, batchStartedKey{&m.multiTracer}, ctxs)
}

// TraceBatchEnd calls TraceBatchEnd of each tracer that is a BatchTracer,
// the last started first.
func (m *multiBatchTracer) TraceBatchEnd(ctx context.Context, recs []*kgo.Record, res []Result, err error) {
	ctxs := started(ctx, batchStartedKey{&m.multiTracer}, len(m.batch))
	for i := len(m.batch) - 1; i >= 0; i-- {
		m.batch[i].TraceBatchEnd(ctxs[i], recs, res, err)
	}
}
