package consumer

import (
	"context"
	"log/slog"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/queue"
)

// lane takes one partition's records from the poll loop and applies them:
// up to [Config.Concurrency] records or batches at once, in the order its
// queue allows.
type lane struct {
	c  *Consumer
	tp partition
	// stop ends when the lane takes no more records. Its records in
	// flight may finish within work, which ends later (see retire).
	stop       context.Context
	halted     context.CancelFunc
	work       context.Context
	cancelWork context.CancelFunc
	// open holds the sessions of the lane's open transactions; it is part
	// of the Consumer's.
	open openSet
	// wg counts the lane's workers.
	wg sync.WaitGroup

	mu sync.Mutex
	q  *queue.Queue
	// workers is how many of the lane's goroutines are applying records.
	workers int
	// commitAt is the offset last committed (one past a record), -1
	// before the first commit.
	commitAt int64
	paused   bool
	stopped  bool
}

func newLane(c *Consumer, tp partition) *lane {
	key := orderKey
	if c.cfg.Unordered {
		key = nil
	}
	l := &lane{c: c, tp: tp, q: queue.New(key), commitAt: -1}
	l.open.parent = &c.open
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
// and starts what may start. It does not pause the partition's fetching:
// the poll loop does (pauseIfFull), once franz-go holds none of the
// partition's records.
func (l *lane) add(recs []*kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	l.q.Push(recs)
	l.start()
}

// full says whether the lane holds PartitionBuffer records or more.
func (l *lane) full() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.q.Len() >= l.c.cfg.PartitionBuffer
}

// pauseIfFull pauses the partition's fetching when the lane holds
// PartitionBuffer records or more, until it is down to half (see finish).
// A lane that stopped is never paused: halt has resumed it for good.
func (l *lane) pauseIfFull() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped || l.paused || l.q.Len() < l.c.cfg.PartitionBuffer {
		return
	}
	l.paused = true
	l.c.client.PauseFetchPartitions(map[string][]int32{l.tp.topic: {l.tp.num}})
}

// start hands batches to new workers while there is room. Under mu.
func (l *lane) start() {
	for !l.stopped && l.workers < l.c.cfg.Concurrency {
		batch := l.q.Pick(l.c.cfg.BatchSize)
		if batch == nil {
			return
		}
		l.workers++
		l.wg.Add(1)
		go l.run(batch)
	}
}

// run is a worker: it applies batch, and then the next batch it is given,
// until there is none. A record that is not done is retried alone: the
// records of its batch after it go back to the queue for other workers,
// so that it holds back only its own aggregate.
func (l *lane) run(batch []*queue.Entry) {
	defer l.wg.Done()
	recs := make([]*kgo.Record, 0, len(batch))
	for batch != nil {
		recs = recs[:0]
		for _, e := range batch {
			recs = append(recs, e.Record())
		}
		n, err := l.c.attempt(l.work, recs)
		if err == nil || l.stop.Err() != nil || l.work.Err() != nil {
			batch = l.finish(batch, n)
			continue
		}
		e := batch[n]
		if len(batch) > 1 {
			l.giveBack(append(batch[:n:n], batch[n+1:]...), n)
		}
		batch = l.finish([]*queue.Entry{e}, l.c.retry(l.stop, l.work, e.Record(), err))
	}
}

// giveBack is finish for the records of a batch but one, which stays in
// flight: the first n of batch are done, the rest waiting again.
func (l *lane) giveBack(batch []*queue.Entry, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.q.Finish(batch, n)
	l.start()
}

// finish gives back batch with its first n records done, resumes a paused
// fetch when the lane has room again, and returns the worker's next batch,
// or nil when the worker is to end. It starts more workers when the batch
// unblocked records for them.
func (l *lane) finish(batch []*queue.Entry, n int) []*queue.Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.q.Finish(batch, n)
	if l.paused && !l.stopped && l.q.Len() <= l.c.cfg.PartitionBuffer/2 {
		l.paused = false
		l.c.client.ResumeFetchPartitions(map[string][]int32{l.tp.topic: {l.tp.num}})
	}
	var next []*queue.Entry
	if !l.stopped {
		next = l.q.Pick(l.c.cfg.BatchSize)
	}
	if next == nil {
		l.workers--
	}
	l.start()
	return next
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
	done := l.q.Done()
	if done == nil || done.Offset+1 <= l.commitAt {
		return nil
	}
	return done
}

// committed notes that the offset after r is committed.
func (l *lane) committed(r *kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.commitAt = max(l.commitAt, r.Offset+1)
}

// attempt applies recs (records of one partition that may be applied
// together, in offset order) once and returns how many of them, from the
// first, are done, and, when that is not all, why the next one is not.
func (c *Consumer) attempt(work context.Context, recs []*kgo.Record) (int, error) {
	if len(recs) == 1 {
		if _, err := c.proc.Process(work, recs[0]); err != nil {
			return 0, err
		}
		return 1, nil
	}
	res, err := c.proc.ProcessBatch(work, recs)
	return len(res), err
}

// retry applies rec, which is not done for the reason err (a database
// failure, or a gap under GapFail), until it is done (1) or stop or work
// ends (0), with backoff. Order holds: nothing of its aggregate runs
// meanwhile.
func (c *Consumer) retry(stop, work context.Context, rec *kgo.Record, err error) int {
	for attempt := 1; ; attempt++ {
		c.log.WarnContext(work, "consumer: record not done, retrying", slog.String("topic", rec.Topic),
			slog.Int("partition", int(rec.Partition)), slog.Int64("offset", rec.Offset), slog.String("error", err.Error()))
		if sleep(stop, c.cfg.backoff(attempt)) != nil {
			return 0
		}
		if _, err = c.proc.Process(work, rec); err == nil {
			return 1
		}
		if stop.Err() != nil || work.Err() != nil {
			return 0
		}
	}
}
