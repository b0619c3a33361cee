// Package queue orders one partition's records for the workers that apply
// them: it hands out batches that may run now (never two records of one
// order key at once, each key's records in offset order) and keeps the done
// prefix, whose last record's offset is what may be committed. The
// consumer's lanes use it; the order key is theirs to define.
package queue

import (
	"github.com/twmb/franz-go/pkg/kgo"
)

// Queue is the order in which a lane applies its partition's records: it
// hands out batches of records that may run now (never two of one order
// key at once, each key's records in offset order) and keeps the done
// prefix, whose last record's offset is what the lane commits. Not safe
// for concurrent use: the lane holds its mutex around every call.
type Queue struct {
	// entries holds the records received from the first one not done, in
	// offset order.
	entries []*Entry
	// busy counts, per order key, the records of it in flight.
	busy map[string]int
	// highest is the highest offset received: a record at or below it is
	// one the queue has had already (a fetch that overlapped an earlier
	// one) and is not queued twice.
	highest int64
	// done is the last record of the done prefix, nil before the first.
	done *kgo.Record
	// key is the order key of a record; nil when no record is ordered
	// against another.
	key func(*kgo.Record) string
}

// Entry is a record in a Queue.
type Entry struct {
	rec   *kgo.Record
	key   string // Queue.key(rec)
	state entryState
}

// Record returns the entry's record.
func (e *Entry) Record() *kgo.Record { return e.rec }

type entryState uint8

const (
	waiting entryState = iota
	inFlight
	finished
)

// New returns an empty Queue that orders records by key: records of one
// key go one after another in offset order, and a record whose key is ""
// goes freely. With a nil key, every record goes freely.
func New(key func(*kgo.Record) string) *Queue {
	return &Queue{busy: map[string]int{}, highest: -1, key: key}
}

// Push appends recs, in offset order, leaving out those at or below the
// highest offset received.
func (q *Queue) Push(recs []*kgo.Record) {
	for _, r := range recs {
		if r.Offset <= q.highest {
			continue
		}
		q.highest = r.Offset
		e := &Entry{rec: r}
		if q.key != nil {
			e.key = q.key(r)
		}
		q.entries = append(q.entries, e)
	}
}

// Len returns how many records the queue holds: waiting, in flight, or
// done above a record that is not.
func (q *Queue) Len() int { return len(q.entries) }

// Done returns the last record of the done prefix, nil before the first
// record is done.
func (q *Queue) Done() *kgo.Record { return q.done }

// Pick takes up to n waiting records, in offset order, that may run now:
// none of a key with a record in flight or with an earlier record left
// waiting. Records of one key in a batch are consecutive among that key's
// records. It returns nil when none may run.
func (q *Queue) Pick(n int) []*Entry {
	var (
		batch []*Entry
		// mine holds the keys this batch took: their next records may
		// join it. A key busy in another batch stays busy through the
		// whole scan, so none of its records is taken after one was left.
		mine map[string]bool
	)
	for _, e := range q.entries {
		if e.state != waiting {
			continue
		}
		if e.key != "" && q.busy[e.key] > 0 && !mine[e.key] {
			continue
		}
		batch = append(batch, e)
		e.state = inFlight
		if e.key != "" {
			q.busy[e.key]++
			if mine == nil {
				mine = map[string]bool{}
			}
			mine[e.key] = true
		}
		if len(batch) == n {
			break
		}
	}
	return batch
}

// Finish marks the first n entries of batch (one Pick's) done and the
// rest waiting again, and moves the done prefix on.
func (q *Queue) Finish(batch []*Entry, n int) {
	for i, e := range batch {
		if e.key != "" {
			if q.busy[e.key]--; q.busy[e.key] <= 0 {
				delete(q.busy, e.key)
			}
		}
		e.state = waiting
		if i < n {
			e.state = finished
		}
	}
	i := 0
	for i < len(q.entries) && q.entries[i].state == finished {
		q.done = q.entries[i].rec
		i++
	}
	clear(q.entries[:i])
	q.entries = q.entries[i:]
}
