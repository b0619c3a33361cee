package consumer

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
)

// queue is the order in which a lane applies its partition's records: it
// hands out batches of records that may run now (never two of one order
// key at once, each key's records in offset order) and keeps the done
// prefix, whose last record's offset is what the lane commits. Not safe
// for concurrent use: the lane holds its mutex around every call.
type queue struct {
	// entries holds the records received from the first one not done, in
	// offset order.
	entries []*entry
	// busy counts, per order key, the records of it in flight.
	busy map[string]int
	// highest is the highest offset received: a record at or below it is
	// one the queue has had already (a fetch that overlapped an earlier
	// one) and is not queued twice.
	highest int64
	// done is the last record of the done prefix, nil before the first.
	done *kgo.Record
	// free says no record is ordered against another.
	free bool
}

// entry is a record in a queue.
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

// newQueue returns an empty queue; with free, every record goes freely
// (Config.Unordered).
func newQueue(free bool) *queue { return &queue{busy: map[string]int{}, highest: -1, free: free} }

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

// push appends recs, in offset order, leaving out those at or below the
// highest offset received.
func (q *queue) push(recs []*kgo.Record) {
	for _, r := range recs {
		if r.Offset <= q.highest {
			continue
		}
		q.highest = r.Offset
		e := &entry{rec: r}
		if !q.free {
			e.key = orderKey(r)
		}
		q.entries = append(q.entries, e)
	}
}

// len returns how many records the queue holds: waiting, in flight, or
// done above a record that is not.
func (q *queue) len() int { return len(q.entries) }

// pick takes up to n waiting records, in offset order, that may run now:
// none of a key with a record in flight or with an earlier record left
// waiting. Records of one key in a batch are consecutive among that key's
// records. It returns nil when none may run.
func (q *queue) pick(n int) []*entry {
	var (
		batch []*entry
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

// finish marks the first n entries of batch (one pick's) done and the
// rest waiting again, and moves the done prefix on.
func (q *queue) finish(batch []*entry, n int) {
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
