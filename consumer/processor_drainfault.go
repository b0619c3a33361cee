package consumer

import (
	"fmt"
	"sync"

	"github.com/d419a114/outbox/ordering"
)

// drainLostError reports a parked record whose handler, run by a drain,
// ran past [Config.HandlerTimeout]: pgx closed the connection of the
// query whose deadline passed, so the drain's whole transaction is lost
// and nothing in it could be saved or dead-lettered. The try counts
// against the parked record (see drainFaults), never against the record
// or operator action that released it. It deliberately does not wrap the
// handler's error: what released the record must not be classified by it.
type drainLostError struct {
	agg   ordering.Aggregate
	seq   int64
	tries int
	cause error
}

func (e *drainLostError) Error() string {
	return fmt.Sprintf("consumer: parked record %s seq %d ran past Config.HandlerTimeout in a drain (try %d) and its connection closed: %s", e.agg, e.seq, e.tries, e.cause.Error())
}

// drainFaults counts, per parked record, the drain tries whose handler
// lost the transaction (drainLostError), which no table can count since
// the transaction that would have written it is gone. A record with a
// count is not run again in a transaction that releases it: it is put
// back and left in line, and drainOnce tries it first in a transaction of
// its own, until it applies or its count reaches [Config.MaxAttempts] and
// it is dead-lettered without another run. The counts live in the
// Processor: a process that restarts counts again from zero. Any goroutine
// touches it under mu.
type drainFaults struct {
	mu sync.Mutex
	n  map[faultKey]*drainLostError
}

type faultKey struct {
	agg ordering.Aggregate
	seq int64
}

// add counts a try of agg's seq that lost its transaction with cause, and
// returns the error that says so.
func (f *drainFaults) add(agg ordering.Aggregate, seq int64, cause error) *drainLostError {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[faultKey]*drainLostError{}
	}
	k := faultKey{agg, seq}
	e := &drainLostError{agg: agg, seq: seq, cause: cause}
	if old := f.n[k]; old != nil {
		e.tries = old.tries
	}
	e.tries++
	f.n[k] = e
	return e
}

// get returns what add counted for agg's seq, or nil.
func (f *drainFaults) get(agg ordering.Aggregate, seq int64) *drainLostError {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[faultKey{agg, seq}]
}

// pending reports whether a record of agg has a count: it waits for
// drainOnce.
func (f *drainFaults) pending(agg ordering.Aggregate) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range f.n {
		if k.agg == agg {
			return true
		}
	}
	return false
}

// clear forgets agg's seq: it applied or was dead-lettered.
func (f *drainFaults) clear(agg ordering.Aggregate, seq int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.n, faultKey{agg, seq})
}
