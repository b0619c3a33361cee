package consumer

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// runners maps each client to the Consumer running on it, for the group
// callbacks ClientOpts installs: they are given the client, not the
// Consumer.
var runners sync.Map

// runnerOf returns the Consumer running on cl, or nil.
func runnerOf(cl *kgo.Client) *Consumer {
	c, _ := runners.Load(cl)
	r, _ := c.(*Consumer)
	return r
}

// early holds, per client on which no Consumer runs yet, the partitions
// the group assigned it: a client joins its group when it is created, so
// the first assignment often comes before Run, which logs it then.
var early sync.Map

// earlyParts is one client's partitions assigned before Run.
type earlyParts struct {
	mu    sync.Mutex
	parts map[string]map[int32]bool
}

// note adds (or, with add false, removes) parts.
func (e *earlyParts) note(parts map[string][]int32, add bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for topic, nums := range parts {
		if e.parts[topic] == nil {
			e.parts[topic] = map[int32]bool{}
		}
		for _, n := range nums {
			if add {
				e.parts[topic][n] = true
			} else {
				delete(e.parts[topic], n)
			}
		}
		if len(e.parts[topic]) == 0 {
			delete(e.parts, topic)
		}
	}
}

// noteEarly records parts assigned (or taken away) before Run on cl.
func noteEarly(cl *kgo.Client, parts map[string][]int32, add bool) {
	v, _ := early.LoadOrStore(cl, &earlyParts{parts: map[string]map[int32]bool{}})
	v.(*earlyParts).note(parts, add)
}

// takeEarly returns, and forgets, what the group assigned cl before Run.
func takeEarly(cl *kgo.Client) map[string][]int32 {
	v, ok := early.LoadAndDelete(cl)
	if !ok {
		return nil
	}
	e := v.(*earlyParts)
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string][]int32{}
	for topic, nums := range e.parts {
		for n := range nums {
			out[topic] = append(out[topic], n)
		}
		slices.Sort(out[topic])
	}
	return out
}

// onAssigned logs the partitions the group gave this member, or keeps
// them for Run to log when it has not started yet.
func onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	if c := runnerOf(cl); c != nil {
		c.logPartitions(ctx, "assigned", assigned)
		return
	}
	noteEarly(cl, assigned, true)
}

// logPartitions logs at INFO that parts were assigned, revoked or lost,
// naming the member, its group and its generation.
func (c *Consumer) logPartitions(ctx context.Context, how string, parts map[string][]int32) {
	member, gen := c.client.GroupMetadata()
	group, _ := c.client.OptValue(kgo.ConsumerGroup).(string)
	c.log.InfoContext(ctx, "consumer: partitions "+how, slog.String("group", group), slog.String("member_id", member),
		slog.Int("generation", int(gen)), slog.Any("partitions", parts))
}

// onRevoked finishes the revoked partitions' records and commits their
// offsets before the group hands them to another member.
func onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if probed(ctx) {
		return
	}
	if c := runnerOf(cl); c != nil {
		c.leave(ctx, revoked, false)
		return
	}
	noteEarly(cl, revoked, false)
}

// onLost abandons the lost partitions' records: another member may own
// them already, so nothing is committed for them.
func onLost(ctx context.Context, cl *kgo.Client, lost map[string][]int32) {
	if probed(ctx) {
		return
	}
	if c := runnerOf(cl); c != nil {
		c.leave(ctx, lost, true)
		return
	}
	noteEarly(cl, lost, false)
}

// probeKey marks the context routesToConsumer calls the callbacks with.
type probeKey struct{}

// routesToConsumer says whether cl's OnPartitionsRevoked and
// OnPartitionsLost are onRevoked and onLost. franz-go wraps the callbacks
// it is given, so they cannot be compared; each is called once with no
// partitions and a context that onRevoked and onLost recognise and count.
func routesToConsumer(cl *kgo.Client) bool {
	var seen atomic.Int32
	ctx := context.WithValue(context.Background(), probeKey{}, &seen)
	for _, opt := range []any{kgo.OnPartitionsRevoked, kgo.OnPartitionsLost} {
		fn, _ := cl.OptValue(opt).(func(context.Context, *kgo.Client, map[string][]int32))
		if fn == nil {
			return false
		}
		fn(ctx, cl, nil)
	}
	return seen.Load() == 2
}

// probed counts a call of routesToConsumer's and says whether ctx is one.
func probed(ctx context.Context) bool {
	seen, ok := ctx.Value(probeKey{}).(*atomic.Int32)
	if ok {
		seen.Add(1)
	}
	return ok
}

// leave takes the lanes of parts out of the Consumer and retires them.
func (c *Consumer) leave(ctx context.Context, parts map[string][]int32, lost bool) {
	c.mu.Lock()
	var lanes []*lane
	for topic, nums := range parts {
		for _, n := range nums {
			tp := partition{topic, n}
			if l := c.lanes[tp]; l != nil {
				lanes = append(lanes, l)
				delete(c.lanes, tp)
			}
			if c.watch != nil {
				c.watch.forget(tp)
			}
		}
	}
	c.mu.Unlock()
	if len(lanes) == 0 {
		return
	}
	how := "revoked"
	if lost {
		how = "lost"
	}
	c.logPartitions(ctx, how, parts)
	c.retire(ctx, lanes, lost)
}

// retire stops lanes from taking records and waits for their records in
// flight: ShutdownGrace, then (or at once, when the partitions were lost)
// their handlers' contexts are cancelled; abandonAfter later, the database
// sessions of the transactions still open are ended, which rolls them
// back, and retire returns without waiting for their handlers. Unless the
// partitions were lost, it then commits the lanes' offsets.
func (c *Consumer) retire(ctx context.Context, lanes []*lane, lost bool) {
	if len(lanes) == 0 {
		return
	}
	for _, l := range lanes {
		l.halt()
	}
	idle := make(chan struct{})
	go func() {
		defer close(idle)
		for _, l := range lanes {
			l.wg.Wait()
		}
	}()
	grace := c.cfg.ShutdownGrace
	if lost {
		grace = 0
	}
	if !within(idle, grace) {
		for _, l := range lanes {
			l.cancelWork()
		}
		if !within(idle, abandonAfter) {
			var pids []session
			for _, l := range lanes {
				pids = append(pids, l.open.pids()...)
			}
			c.log.ErrorContext(ctx, "consumer: handlers did not return after ShutdownGrace and the cancel of their contexts; rolling back their transactions and going on without them",
				slog.Duration("shutdown_grace", grace), slog.Int("transactions", len(pids)))
			if err := endSessions(context.WithoutCancel(ctx), c.log, pids); err != nil {
				c.log.ErrorContext(ctx, "consumer: could not end the sessions of abandoned transactions; they end when their handlers return",
					slog.String("error", err.Error()))
			}
		}
	}
	for _, l := range lanes {
		l.cancelWork()
	}
	if !lost {
		c.commit(ctx, lanes)
	}
}
