package history

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Aggregate names the entity whose events are ordered by sequence number.
type Aggregate struct {
	Type string
	ID   string
}

func (a Aggregate) String() string { return a.Type + "/" + a.ID }

// Write is one write attempt on the producer side.
type Write struct {
	// EventID is the event's id, the default idempotency key.
	EventID   string
	Aggregate Aggregate
	// Seq is the aggregate sequence number the writer allocated.
	Seq int64
	// Committed is true when the attempt's transaction committed, false when
	// it rolled back (or its outcome is known to be a rollback).
	Committed bool
}

// Handle is one handler call on the consumer side.
type Handle struct {
	// Key is the idempotency key: the event id unless the consumer extracts
	// another key.
	Key       string
	Aggregate Aggregate
	// Seq is the aggregate sequence number the record carried; 0 when it
	// carried none, which leaves the record out of the order check.
	Seq int64
	// Applied is true when the handler's effect was applied (its transaction
	// committed), false when the record was skipped as a duplicate.
	Applied bool
	// Where says where the record was read (for a Kafka record, its
	// partition and offset); optional, shown in a reorder's example so
	// that a report tells a reorder on the wire from a record the
	// consumer skipped.
	Where string
}

// Recorder collects a history. It is safe for concurrent use; the zero value
// is ready.
type Recorder struct {
	mu      sync.Mutex
	writes  []Write  // guarded by mu
	handles []Handle // guarded by mu, in call order
}

// Write records a write attempt. Call it once the attempt's outcome is
// known.
func (r *Recorder) Write(w Write) {
	r.mu.Lock()
	r.writes = append(r.writes, w)
	r.mu.Unlock()
}

// Handle records a handler call. The order check reads handler calls in the
// order Handle was called, so call it in the order effects were applied per
// aggregate: right after the handler's transaction commits, from the
// goroutine that owns the record's partition.
func (r *Recorder) Handle(h Handle) {
	r.mu.Lock()
	r.handles = append(r.handles, h)
	r.mu.Unlock()
}

// maxExamples bounds the ids a Report keeps per anomaly.
const maxExamples = 5

// Report is the result of Check. The counts are exact; the example slices
// hold at most a few offending keys each, for failure messages.
type Report struct {
	Writes, Committed, RolledBack int // write attempts and their outcomes
	Handles, Applied, Skipped     int // handler calls and their outcomes

	// Lost counts committed events whose effect was never applied.
	Lost int
	// Phantom counts events whose effect was applied although no write of
	// them committed.
	Phantom int
	// Duplicates counts applications beyond the first, over all events: an
	// event applied three times adds 2.
	Duplicates int
	// Reorders counts applications, other than duplicates, whose sequence
	// number was not the aggregate's last applied one plus 1. The first
	// expected number is the aggregate's lowest committed one.
	Reorders int
	// Redeliveries counts handler calls for a key already handled before,
	// whatever their outcome.
	Redeliveries int

	LostKeys, PhantomKeys, DuplicateKeys, ReorderedKeys []string
}

// OK reports whether the history keeps the guarantees: nothing lost, no
// phantom, no duplicate effect, no reorder.
func (r Report) OK() bool {
	return r.Lost == 0 && r.Phantom == 0 && r.Duplicates == 0 && r.Reorders == 0
}

// Check counts the anomalies of the history recorded so far.
func (r *Recorder) Check() Report {
	r.mu.Lock()
	writes := append([]Write(nil), r.writes...)
	handles := append([]Handle(nil), r.handles...)
	r.mu.Unlock()

	var rep Report
	committed := map[string]bool{}    // event id -> some attempt committed
	firstSeq := map[Aggregate]int64{} // lowest committed seq per aggregate
	for _, w := range writes {
		rep.Writes++
		if !w.Committed {
			rep.RolledBack++
			continue
		}
		rep.Committed++
		committed[w.EventID] = true
		if s, ok := firstSeq[w.Aggregate]; w.Seq > 0 && (!ok || w.Seq < s) {
			firstSeq[w.Aggregate] = w.Seq
		}
	}

	seen := map[string]bool{}        // key -> handled before
	applied := map[string]int{}      // key -> times applied
	last := map[Aggregate]int64{}    // last applied seq per aggregate
	lastAt := map[Aggregate]string{} // where the last applied record was read
	for _, h := range handles {
		rep.Handles++
		if seen[h.Key] {
			rep.Redeliveries++
		}
		seen[h.Key] = true
		if !h.Applied {
			rep.Skipped++
			continue
		}
		rep.Applied++
		applied[h.Key]++
		if applied[h.Key] > 1 {
			rep.Duplicates++
			rep.DuplicateKeys = example(rep.DuplicateKeys, h.Key)
			continue
		}
		if !committed[h.Key] {
			rep.Phantom++
			rep.PhantomKeys = example(rep.PhantomKeys, h.Key)
		}
		if h.Seq <= 0 {
			continue
		}
		prev, ok := last[h.Aggregate]
		if !ok {
			prev = h.Seq - 1 // an aggregate with no committed write starts anywhere
			if s, ok := firstSeq[h.Aggregate]; ok {
				prev = s - 1
			}
		}
		if h.Seq != prev+1 {
			rep.Reorders++
			ex := fmt.Sprintf("%s %s seq %d after %d", h.Aggregate, h.Key, h.Seq, prev)
			if h.Where != "" {
				ex = fmt.Sprintf("%s %s seq %d at %s after %d at %s", h.Aggregate, h.Key, h.Seq, h.Where, prev, lastAt[h.Aggregate])
			}
			rep.ReorderedKeys = example(rep.ReorderedKeys, ex)
		}
		if h.Seq >= prev {
			lastAt[h.Aggregate] = h.Where
		}
		last[h.Aggregate] = max(prev, h.Seq)
	}

	var lost []string
	for id := range committed {
		if applied[id] == 0 {
			lost = append(lost, id)
		}
	}
	sort.Strings(lost)
	rep.Lost = len(lost)
	rep.LostKeys = lost[:min(len(lost), maxExamples)]
	return rep
}

func example(keys []string, k string) []string {
	if len(keys) < maxExamples {
		keys = append(keys, k)
	}
	return keys
}

// String renders the report as a table, the anomalies marked.
func (r Report) String() string {
	var b strings.Builder
	row := func(name string, n int, note string) {
		fmt.Fprintf(&b, "%-22s %9d  %s\n", name, n, note)
	}
	bad := func(n int, keys []string) string {
		if n == 0 {
			return "ok"
		}
		return "FAIL, e.g. " + strings.Join(keys, "; ")
	}
	row("write attempts", r.Writes, "")
	row("  committed", r.Committed, "")
	row("  rolled back", r.RolledBack, "")
	row("handler calls", r.Handles, "")
	row("  applied", r.Applied, "")
	row("  skipped (duplicate)", r.Skipped, "")
	row("lost", r.Lost, bad(r.Lost, r.LostKeys))
	row("phantom", r.Phantom, bad(r.Phantom, r.PhantomKeys))
	row("duplicate effects", r.Duplicates, bad(r.Duplicates, r.DuplicateKeys))
	row("reorders", r.Reorders, bad(r.Reorders, r.ReorderedKeys))
	row("redeliveries", r.Redeliveries, "expected under at-least-once")
	return b.String()
}
