package consumer

import (
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// fetchWatch is a kgo hook, installed by ClientOpts, that notes per
// partition the highest offset franz-go has buffered from a fetch. franz-go
// buffers one fetch of a partition at a time and hands its records to
// polls in offset order, so a partition whose last polled record is below
// that offset still has records of that fetch in franz-go's buffer. A
// watch shared by two clients (one ClientOpts list given to both) notes the
// higher of their offsets, which at worst defers a pause longer (see
// pauser).
type fetchWatch struct {
	to sync.Map // partition: *atomic.Int64
}

// OnFetchRecordBuffered implements kgo.HookFetchRecordBuffered.
func (w *fetchWatch) OnFetchRecordBuffered(r *kgo.Record) {
	tp := partition{r.Topic, r.Partition}
	v, ok := w.to.Load(tp)
	if !ok {
		v, _ = w.to.LoadOrStore(tp, new(atomic.Int64))
	}
	to := v.(*atomic.Int64)
	for cur := to.Load(); r.Offset > cur && !to.CompareAndSwap(cur, r.Offset); cur = to.Load() {
	}
}

// bufferedTo returns the highest offset of tp franz-go has buffered since
// the partition was last forgotten, or -1.
func (w *fetchWatch) bufferedTo(tp partition) int64 {
	if v, ok := w.to.Load(tp); ok {
		return v.(*atomic.Int64).Load()
	}
	return -1
}

// forget drops what w noted of tp, which this member no longer consumes:
// when the partition comes back, its fetches may start below that.
func (w *fetchWatch) forget(tp partition) { w.to.Delete(tp) }

// watchOf returns the fetchWatch among cl's hooks, or nil.
func watchOf(cl *kgo.Client) *fetchWatch {
	hooks, _ := cl.OptValue(kgo.WithHooks).([]kgo.Hook)
	for _, h := range hooks {
		if w, ok := h.(*fetchWatch); ok {
			return w
		}
	}
	return nil
}

// pauser decides, after each poll, which full lanes have their partition's
// fetching paused (see Consumer.poll): every lane the poll fed, except the
// last when the poll was full (it returned MaxPollRecords records) and
// franz-go still holds records of that lane's partition. franz-go takes a
// poll's records fetch by fetch and partition by partition, so only that
// partition can have records left in its buffer, and they come first in
// the next poll; its pause waits (the lane is deferred) until the poll
// that takes the last of them, and no longer: a lane is deferred at most
// until it has the records of its partition franz-go held when it was
// first deferred, so that it cannot take a backlog whole when its
// partition is the last of every poll.
type pauser struct {
	watch *fetchWatch // nil without ClientOpts' hook: nothing is deferred
	// lanes are the lanes the poll fed, in its order, and last the offset
	// of the last record it gave the last of them.
	lanes []*lane
	last  int64
	// deferred is the lane whose pause waits, until it has its records
	// up to offset end.
	deferred *lane
	end      int64
}

func (c *Consumer) newPauser() *pauser { return &pauser{watch: c.watch} }

// fed notes that the poll gave l recs.
func (p *pauser) fed(l *lane, recs []*kgo.Record) {
	p.lanes = append(p.lanes, l)
	p.last = recs[len(recs)-1].Offset
}

// polled pauses the full lanes of the poll, and the one deferred before,
// except the one it defers (see pauser).
func (p *pauser) polled(full bool) {
	var keep *lane
	if n := len(p.lanes); full && n > 0 && p.watch != nil && p.lanes[n-1].full() {
		l := p.lanes[n-1]
		if l != p.deferred {
			p.end = p.watch.bufferedTo(l.tp)
		}
		if p.last < p.end {
			keep = l
		}
	}
	if p.deferred != nil && p.deferred != keep {
		p.deferred.pauseIfFull()
	}
	for _, l := range p.lanes {
		if l != keep {
			l.pauseIfFull()
		}
	}
	p.deferred = keep
	clear(p.lanes)
	p.lanes = p.lanes[:0]
}
