package producer

import (
	"cmp"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// Health is the producer side's state, as [Inspector.Health] reads it from
// the health view.
//
// Alert on OldestUndelivered (say, over five minutes) and on Dead > 0, not
// on Undelivered: a large backlog that drains fast is healthy, and a single
// event stuck for an hour is not. Age rising while the broker's lag is flat
// points at the relay; both rising points at the broker or the consumers.
// Age rising for a few seconds after a relay died is its successor waiting
// for the dead relay's leases: [Relay.Health] says which aggregates and until
// when.
type Health struct {
	// Undelivered counts events not yet acknowledged by the broker.
	Undelivered int64
	// OldestUndelivered is the age of the oldest undelivered event; zero
	// when there is none.
	OldestUndelivered time.Duration
	// Dead counts events that exhausted their attempts and wait for a
	// replay or discard.
	Dead int64
	// OldestUndeliveredError is the last publish error of the oldest
	// undelivered event (for a topic that does not exist: "topic ... does
	// not exist"); "" when it has not failed yet, or there is none.
	OldestUndeliveredError string

	// Dispatch is who publishes the schema's events (SetDispatch). In
	// DispatchCDC mode events are written as published, so Undelivered and
	// OldestUndelivered stay 0; what lags is the slot, below. Alert in CDC
	// mode on CDCSlotActive being false for longer than a connector
	// restart takes (a minute), and on CDCRetainedWALBytes (say, over a
	// tenth of the WAL volume's free space): while the connector is down
	// the slot keeps every WAL segment from its position on, and the
	// volume fills up.
	Dispatch Dispatch
	// CDCSlot is the replication slot of DispatchCDC; "" otherwise.
	CDCSlot string
	// CDCSlotExists is whether that slot exists in this database. A slot
	// that vanished (dropped, or invalidated by max_slot_wal_keep_size)
	// means events written meanwhile were never captured.
	CDCSlotExists bool
	// CDCSlotActive is whether a connector is attached to the slot.
	CDCSlotActive bool
	// CDCRetainedWALBytes is how much WAL the slot keeps from removal (from
	// its restart position to the server's current one); 0 when there is
	// no slot, or on a standby.
	CDCRetainedWALBytes int64
	// CDCLagBytes is how far the connector's confirmed position is behind
	// the server's current one, in WAL bytes; 0 as for CDCRetainedWALBytes.
	CDCLagBytes int64
}

// RelayHealth is a running relay's own account of its share of the work,
// for a health endpoint of the process that runs it; [Relay.Health] returns
// it. Undelivered events whose age climbs while Held lists their aggregate
// are waiting for a lease, not lost: the relay logs each hold at WARN too.
type RelayHealth struct {
	// RelayID names the instance ([RelayConfig.RelayID]).
	RelayID string
	// Buckets counts the buckets the instance owns, of 64.
	Buckets int
	// Unchecked counts owned buckets whose leased rows could not be looked
	// up yet (the database failed the query): nothing is claimed from them
	// until they are.
	Unchecked int
	// FailingTopics lists the topics whose last publish by this instance
	// failed, with the error, in topic order; empty when every topic's
	// last publish went through. A topic leaves the list when a record of
	// it is acknowledged. A topic that does not exist says so here
	// ("topic ... does not exist").
	FailingTopics []TopicFailure
	// Held lists the aggregates the instance leaves out of its claims,
	// earliest end first, because rows of theirs are still leased: to a
	// relay that lost their bucket (died, or lost its session) and may still
	// be publishing them, or by a batch of this relay whose outcome could
	// not be recorded. Empty when the relay waits for nothing.
	Held []HeldAggregate
}

// HeldAggregate is one aggregate a relay waits for.
type HeldAggregate struct {
	// AggregateType and AggregateID name the aggregate.
	AggregateType, AggregateID string
	// Bucket is the aggregate's bucket.
	Bucket int
	// Until is when the lease the relay waits for ends. The relay looks
	// again then: a lease renewed meanwhile (its relay still waits for the
	// broker) holds the aggregate on.
	Until time.Time
	// OwnBatch is true when the lease is of a batch of this relay whose
	// outcome could not be recorded, false when it is another relay's.
	OwnBatch bool
}

// TopicFailure is a topic whose publishes fail, in RelayHealth.
type TopicFailure struct {
	// Topic names the topic.
	Topic string
	// Error is the last publish error of one of its records.
	Error string
	// Since is when its publishes started to fail; Last when one last did.
	Since, Last time.Time
	// Failures counts the records that failed since Since.
	Failures int
}

// failingTopics is the state behind [RelayHealth.FailingTopics].
type failingTopics struct {
	mu sync.Mutex
	m  map[string]*TopicFailure
}

// observe takes a published batch's outcomes at now.
func (f *failingTopics) observe(out []outcome, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range out {
		switch {
		case o.err == nil:
			delete(f.m, o.topic)
		case errors.Is(o.err, errHeldBack):
		default:
			if f.m == nil {
				f.m = map[string]*TopicFailure{}
			}
			tf := f.m[o.topic]
			if tf == nil {
				tf = &TopicFailure{Topic: o.topic, Since: now}
				f.m[o.topic] = tf
			}
			tf.Error, tf.Last = o.err.Error(), now
			tf.Failures++
		}
	}
}

// waitingOn names, for the log line of a batch the broker has not answered
// yet, the batch's topics and, for those whose last publish failed, that
// failure: the cause the wait most likely has.
func (r *Relay) waitingOn(batch []*claimedEvent) slog.Attr {
	seen := map[string]bool{}
	var topics, failures []string
	for _, e := range batch {
		t := r.topicFor(e)
		if seen[t] {
			continue
		}
		seen[t] = true
		topics = append(topics, t)
	}
	slices.Sort(topics)
	r.failing.mu.Lock()
	for _, t := range topics {
		if tf := r.failing.m[t]; tf != nil {
			failures = append(failures, tf.Error)
		}
	}
	r.failing.mu.Unlock()
	attrs := []any{slog.String("topics", strings.Join(topics, ","))}
	if len(failures) > 0 {
		attrs = append(attrs, slog.String("last_failure", strings.Join(failures, "; ")))
	}
	return slog.Group("waiting_on", attrs...)
}

// list returns the failing topics in topic order.
func (f *failingTopics) list() []TopicFailure {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []TopicFailure
	for _, tf := range f.m {
		out = append(out, *tf)
	}
	slices.SortFunc(out, func(a, b TopicFailure) int { return cmp.Compare(a.Topic, b.Topic) })
	return out
}

// Health returns the relay's current RelayHealth. It is safe to call from
// any goroutine, while Run runs or not; it does not block and does not
// touch the database.
func (r *Relay) Health() RelayHealth {
	h := RelayHealth{RelayID: r.cfg.RelayID}
	if p := r.health.Load(); p != nil {
		h = *p
	}
	h.FailingTopics = r.failing.list()
	return h
}

// publishHealth makes the owner's state what [Relay.Health] returns.
func (o *bucketOwner) publishHealth() {
	h := &RelayHealth{RelayID: o.r.cfg.RelayID, Buckets: len(o.owned), Unchecked: len(o.unchecked)}
	for _, hd := range o.holds {
		h.Held = append(h.Held, HeldAggregate{AggregateType: hd.aggregateType, AggregateID: hd.aggregateID,
			Bucket: int(hd.bucket), Until: hd.until, OwnBatch: hd.own})
	}
	slices.SortFunc(h.Held, func(a, b HeldAggregate) int {
		return cmp.Or(a.Until.Compare(b.Until), cmp.Compare(a.AggregateType, b.AggregateType), cmp.Compare(a.AggregateID, b.AggregateID))
	})
	o.r.health.Store(h)
}
