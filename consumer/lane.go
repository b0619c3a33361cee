package consumer

import (
	"context"
	"log/slog"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
)

// lane takes one partition's records from the poll loop and applies them:
// up to Config.Concurrency records or batches at once, never two records
// of one order key at once, each key's records in offset order.
type lane struct {
	c  *Consumer
	tp partition
	// stop ends when the lane takes no more records. Its records in
	// flight may finish within work, which ends later (see retire).
	stop       context.Context
	halted     context.CancelFunc
	work       context.Context
	cancelWork context.CancelFunc
	// open holds the sessions of the lane's open transactions.
	open openSet
	// wg counts the lane's workers.
	wg sync.WaitGroup

	mu sync.Mutex
	// queue holds the records received and not yet committed past, in
	// offset order, from the first one not done.
	queue []*entry
	// busy counts, per order key, the records of it in flight.
	busy map[string]int
	// workers is how many of the lane's goroutines are applying records.
	workers int
	// highest is the highest offset received: a record at or below it is
	// one the lane has had already, in a fetch from before a rebalance.
	highest int64
	// done is the last record of the done prefix; commit is the offset
	// last committed (one past a record).
	done     *kgo.Record
	commitAt int64
	paused   bool
	stopped  bool
}

// entry is a record in a lane.
type entry struct {
	rec   *kgo.Record
	key   string // orderKey(rec)
	state entryState
}

type entryState uint8

const (
	waiting entryState = iota
	inFlight
	finished
)

func newLane(c *Consumer, tp partition) *lane {
	l := &lane{c: c, tp: tp, busy: map[string]int{}, highest: -1, commitAt: -1}
	l.stop, l.halted = context.WithCancel(context.Background())
	work, cancel := context.WithCancel(context.Background())
	l.work, l.cancelWork = withOpenSet(work, &l.open), cancel
	return l
}

// orderKey returns what orders rec against the partition's other records:
// its aggregate (type and id, the id taken from the record key when it has
// no id header, as the Processor does), or "" for a record with neither,
// which goes freely.
func orderKey(rec *kgo.Record) string {
	id, ok := header(rec.Headers, outbox.HeaderAggregateID)
	if !ok {
		id = rec.Key
	}
	if len(id) == 0 {
		return ""
	}
	typ, _ := header(rec.Headers, outbox.HeaderAggregateType)
	return string(typ) + "\x00" + string(id)
}

// add queues recs (one fetch's records of the partition, in offset order)
// and starts what may start. When the lane holds PartitionBuffer records
// or more, the partition's fetching pauses until it is down to half.
func (l *lane) add(recs []*kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	for _, r := range recs {
		if r.Offset <= l.highest {
			continue
		}
		l.highest = r.Offset
		l.queue = append(l.queue, &entry{rec: r, key: orderKey(r)})
	}
	if !l.paused && len(l.queue) >= l.c.cfg.PartitionBuffer {
		l.paused = true
		l.c.client.PauseFetchPartitions(map[string][]int32{l.tp.topic: {l.tp.num}})
	}
	l.start()
}

// start hands records to new workers while there is room. Under mu.
func (l *lane) start() {
	for !l.stopped && l.workers < l.c.cfg.Concurrency {
		batch := l.pick()
		if len(batch) == 0 {
			return
		}
		l.workers++
		l.wg.Add(1)
		go l.apply(batch)
	}
}

// pick takes up to BatchSize waiting records, in offset order, that may
// start now: none of an order key with a record in flight or with an
// earlier record left waiting. A batch may hold several records of one
// key; they are then consecutive among the key's records. Under mu.
func (l *lane) pick() []*entry {
	var (
		batch   []*entry
		mine    map[string]bool
		blocked map[string]bool
	)
	for _, e := range l.queue {
		if e.state != waiting {
			continue
		}
		if e.key != "" && (blocked[e.key] || l.busy[e.key] > 0 && !mine[e.key]) {
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[e.key] = true
			continue
		}
		batch = append(batch, e)
		e.state = inFlight
		if e.key != "" {
			l.busy[e.key]++
			if mine == nil {
				mine = map[string]bool{}
			}
			mine[e.key] = true
		}
		if len(batch) == l.c.cfg.BatchSize {
			break
		}
	}
	return batch
}

// apply is a worker: it applies batch and gives it back done.
func (l *lane) apply(batch []*entry) {
	defer l.wg.Done()
	recs := make([]*kgo.Record, len(batch))
	for i, e := range batch {
		recs[i] = e.rec
	}
	n := l.c.apply(l.stop, l.work, recs)
	l.finish(batch, n)
}

// finish marks the first n entries of batch done and the rest waiting
// again, moves the done prefix on, resumes a paused fetch when the lane has
// room again, and starts what may start.
func (l *lane) finish(batch []*entry, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, e := range batch {
		if e.key != "" {
			if l.busy[e.key]--; l.busy[e.key] <= 0 {
				delete(l.busy, e.key)
			}
		}
		e.state = waiting
		if i < n {
			e.state = finished
		}
	}
	l.workers--
	i := 0
	for i < len(l.queue) && l.queue[i].state == finished {
		l.done = l.queue[i].rec
		i++
	}
	clear(l.queue[:i])
	l.queue = l.queue[i:]
	if l.paused && !l.stopped && len(l.queue) <= l.c.cfg.PartitionBuffer/2 {
		l.paused = false
		l.c.client.ResumeFetchPartitions(map[string][]int32{l.tp.topic: {l.tp.num}})
	}
	l.start()
}

// halt stops the lane from taking records and resumes its partition's
// fetching if the lane had paused it, so that the partition is fetched
// again when it comes back to this member.
func (l *lane) halt() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	l.halted()
	if l.paused {
		l.paused = false
		l.c.client.ResumeFetchPartitions(map[string][]int32{l.tp.topic: {l.tp.num}})
	}
}

// uncommitted returns the last record of the done prefix when its offset
// is not committed yet, else nil.
func (l *lane) uncommitted() *kgo.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done == nil || l.done.Offset+1 <= l.commitAt {
		return nil
	}
	return l.done
}

// committed notes that the offset after r is committed.
func (l *lane) committed(r *kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.commitAt = max(l.commitAt, r.Offset+1)
}

// apply applies recs (records of one partition that may be applied
// together, in offset order) and returns how many of them, from the
// first, are done. It retries a record that is not done with backoff and
// gives up only when stop ends; the records in flight then may finish
// within work.
func (c *Consumer) apply(stop, work context.Context, recs []*kgo.Record) int {
	done := 0
	for attempt := 1; done < len(recs); attempt++ {
		rest := recs[done:]
		var (
			res []Result
			err error
		)
		if len(rest) == 1 {
			var r Result
			if r, err = c.proc.Process(work, rest[0]); err == nil {
				res = []Result{r}
			}
		} else {
			res, err = c.proc.ProcessBatch(work, rest)
		}
		done += len(res)
		if err == nil {
			continue
		}
		if stop.Err() != nil || work.Err() != nil {
			return done
		}
		// The record is not done: a database failure, or a gap under
		// GapFail. Retry it without moving on, so order holds.
		r := recs[done]
		c.log.WarnContext(work, "consumer: record not done, retrying", slog.String("topic", r.Topic),
			slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset), slog.String("error", err.Error()))
		if sleep(stop, c.proc.backoff(attempt)) != nil {
			return done
		}
	}
	return done
}
