package integration

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/d419a114/outbox/internal/kafkatest"
)

// crashPoint is a place in the relay's cycle (claim, publish, await the
// acknowledgements, mark, commit the marks) where a scenario stops it.
type crashPoint string

const (
	// afterClaim: the batch is leased in the database, nothing is sent.
	afterClaim crashPoint = "AfterClaim"
	// afterSendBeforeAck: the broker has the records, the relay has no
	// answer; the answer, when it comes, is a lost ack (REQUEST_TIMED_OUT
	// after the write was applied). kfake only.
	afterSendBeforeAck crashPoint = "AfterSendBeforeAck"
	// afterAckBeforeMark: every record is acknowledged, the marks are not
	// sent.
	afterAckBeforeMark crashPoint = "AfterAckBeforeMark"
	// beforeMarkCommit: the marks are in the open transaction, COMMIT is
	// not sent.
	beforeMarkCommit crashPoint = "BeforeMarkCommit"
	// afterMarkCommit: the marks are committed.
	afterMarkCommit crashPoint = "AfterMarkCommit"
)

// claimMarker and markMarker identify the relay's claim and mark statements
// in a trace. They are pieces of internal/tables/relay.go's SQL: if those change,
// the hook never fires and the test fails on its wait, not silently.
const (
	claimMarker = "FOR UPDATE OF e SKIP LOCKED"
	markMarker  = "SET published_at = now()"
)

// pointHook is a pgx tracer on one relay's connections that stops the
// relay's goroutine the first time it reaches a point, after letting skip
// earlier occurrences pass. fired closes when the relay stands at the
// point; it stays there until release is called. Statements of the relay
// run on the goroutine that issues them, so stopping in the tracer stops
// the relay exactly there, with no hook in the producer package.
type pointHook struct {
	point   crashPoint
	skip    atomic.Int32
	fired   chan struct{}
	release func()
	gate    chan struct{}
	once    sync.Once
	// markConn is the connection that sent the last mark batch: its COMMIT
	// is the mark's commit. marked holds the ids that batch marks.
	markConn atomic.Pointer[pgx.Conn]
	marked   atomic.Pointer[[]int64]
}

func newPointHook(p crashPoint, skip int) *pointHook {
	h := &pointHook{point: p, fired: make(chan struct{}), gate: make(chan struct{})}
	h.skip.Store(int32(skip))
	var once sync.Once
	h.release = func() { once.Do(func() { close(h.gate) }) }
	return h
}

type sqlKey struct{}

// batchClaims reports whether b holds the relay's claim, which goes in a
// batch with the setting of its transaction (tables.Relay.ClaimNoFlush).
func batchClaims(b *pgx.Batch) bool {
	for _, q := range b.QueuedQueries {
		if strings.Contains(q.SQL, claimMarker) {
			return true
		}
	}
	return false
}

// claimOutcome is what a batch that holds the claim did, in the context
// TraceBatchStart returned: set by TraceBatchQuery, read by TraceBatchEnd,
// when the claim's transaction has committed.
type claimOutcome struct{ leased bool }

type claimOutcomeKey struct{}

// withClaimOutcome returns ctx with a claimOutcome when b holds the claim.
func withClaimOutcome(ctx context.Context, b *pgx.Batch) context.Context {
	if batchClaims(b) {
		return context.WithValue(ctx, claimOutcomeKey{}, &claimOutcome{})
	}
	return ctx
}

// noteClaim records in ctx's claimOutcome whether the claim leased rows.
func noteClaim(ctx context.Context, data pgx.TraceBatchQueryData) {
	if o, ok := ctx.Value(claimOutcomeKey{}).(*claimOutcome); ok && strings.Contains(data.SQL, claimMarker) {
		o.leased = data.Err == nil && data.CommandTag.RowsAffected() > 0
	}
}

// claimLeased reports whether the batch of ctx held a claim that leased
// rows and committed.
func claimLeased(ctx context.Context, data pgx.TraceBatchEndData) bool {
	o, ok := ctx.Value(claimOutcomeKey{}).(*claimOutcome)
	return ok && o.leased && data.Err == nil
}

// hit stops the calling goroutine at the first occurrence past skip.
func (h *pointHook) hit() {
	if h.skip.Add(-1) >= 0 {
		return
	}
	first := false
	h.once.Do(func() { first = true; close(h.fired) })
	if first {
		<-h.gate
	}
}

func (h *pointHook) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if h.point == beforeMarkCommit && data.SQL == "commit" && h.markConn.Load() == conn {
		h.hit()
	}
	return context.WithValue(ctx, sqlKey{}, data.SQL)
}

func (h *pointHook) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(sqlKey{}).(string)
	switch {
	case h.point == afterMarkCommit && sql == "commit" && data.Err == nil && h.markConn.Load() == conn:
		h.hit()
	}
}

func (h *pointHook) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	ctx = withClaimOutcome(ctx, data.Batch)
	for _, q := range data.Batch.QueuedQueries {
		if strings.Contains(q.SQL, markMarker) {
			h.markConn.Store(conn)
			if ids, ok := q.Arguments[0].([]int64); ok {
				h.marked.Store(&ids)
			}
			if h.point == afterAckBeforeMark {
				h.hit()
			}
			break
		}
	}
	return ctx
}

func (h *pointHook) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	noteClaim(ctx, data)
}

func (h *pointHook) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	if h.point == afterClaim && claimLeased(ctx, data) {
		h.hit()
	}
}

// holdProduce stops the first produce request, past skip, at the broker
// (a cluster of the test's own, where only relays produce): the relay has sent the records and waits for the answer. When
// released, the broker applies the request and answers REQUEST_TIMED_OUT,
// a lost ack. Other requests, including later ones on other connections,
// go through meanwhile.
func holdProduce(fake *kfake.Cluster, skip int) *pointHook {
	h := newPointHook(afterSendBeforeAck, skip)
	fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		// Newer produce versions name topics by id, so any produce counts.
		if len(req.(*kmsg.ProduceRequest).Topics) == 0 || h.skip.Add(-1) >= 0 {
			return nil, nil, false
		}
		first := false
		h.once.Do(func() { first = true })
		if !first {
			return nil, nil, false
		}
		fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut, When: func(r kmsg.Request) bool { return r == req }})
		close(h.fired)
		fake.SleepControl(func() { <-h.gate })
		fake.DropControl()
		return nil, nil, false
	})
	return h
}

// TestScenarioCrashMatrix stops a relay at each point of its cycle while
// writers go on committing and rolling back, and then either cancels it
// (a clean stop: Run must finish the batch it holds) or kills it: its
// PostgreSQL sessions are terminated, as the death of its process would,
// and it never continues except as a zombie that wakes up after a successor
// took over (a process frozen by a pause, then cancelled). A successor
// relay must deliver everything: nothing lost, nothing phantom, each
// aggregate's first appearances in dense order.
func TestScenarioCrashMatrix(t *testing.T) {
	t.Parallel()
	for _, point := range []crashPoint{afterClaim, afterSendBeforeAck, afterAckBeforeMark, beforeMarkCommit, afterMarkCommit} {
		for _, action := range []string{"Cancel", "Kill"} {
			t.Run(string(point)+"/"+action, func(t *testing.T) {
				t.Parallel()
				crashCase(t, point, action == "Kill")
			})
		}
	}
}

func crashCase(t *testing.T, point crashPoint, kill bool) {
	rng := scenarioRand(t)
	var b *kafkatest.Broker
	if point == afterSendBeforeAck {
		b = kafkatest.NewFake(t) // the lost ack is a kfake fault
		t.Logf("Kafka: in-process kfake at %v (the lost ack needs kfake)", b.Addrs)
	} else {
		b = broker(t)
	}
	s := newScenario(t, rng, b, 4)
	stopConsumer := s.startConsumer()
	stopWriters := s.startWriters(writeLoad{Writers: 3, Aggregates: 24, MaxPerTx: 4, Rollback: 0.2, MaxPause: 5 * time.Millisecond, Limit: 4000})

	skip := rng.IntN(3)
	cfg := scenarioRelayConfig()
	var hook *pointHook
	var a *relay
	if point == afterSendBeforeAck {
		hook = holdProduce(b.Fake, skip)
		a = s.startRelay("a", cfg, nil)
	} else {
		hook = newPointHook(point, skip)
		a = s.startRelay("a", cfg, hook)
	}
	t.Cleanup(hook.release) // after the relay's stop, so it runs first: never leave a relay parked
	waitClosed(t, hook.fired, 60*time.Second, "relay a to reach "+string(point))

	// early wakes the zombie before the successor starts, late once the
	// successor delivered what was committed at the crash.
	early := rng.IntN(2) == 0
	if !kill {
		t.Logf("relay a stopped at %s (occurrence %d); cancelling it", point, skip+1)
		a.cancel()
		hook.release()
		a.stop()
	} else {
		n := s.terminate(a.app)
		require.Positive(t, n, "relay a had no session to terminate")
		t.Logf("relay a stopped at %s (occurrence %d); terminated its %d sessions; zombie wakes %s", point, skip+1, n, map[bool]string{true: "early", false: "late"}[early])
		a.cancel() // a dead process does not go on: once awake, it only finishes its batch
		if early {
			hook.release()
		}
	}
	atCrash := s.committedKeys()
	s.startRelay("b", cfg, nil)
	s.waitConsumed(atCrash, 60*time.Second)
	if kill && !early && (point == afterAckBeforeMark || point == beforeMarkCommit) {
		// The batch's records are on the topic already, so the wait above
		// can end before the successor got to them (when nothing else was
		// committed behind them); the zombie wakes late only once the
		// successor marked them, after their lease ran out.
		ids := *hook.marked.Load()
		waitUntil(t, 60*time.Second, "the successor to mark the zombie's batch", func() bool {
			var left int
			require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+s.db.Table("events")+
				` WHERE id = ANY($1) AND published_at IS NULL`, ids).Scan(&left))
			return left == 0
		})
	}
	hook.release()
	a.stop()

	pause(context.Background(), time.Duration(rng.IntN(500))*time.Millisecond) // writes go on behind the successor
	stopWriters()
	s.drain(60 * time.Second)
	stopConsumer()
	rep := s.check()
	switch {
	case !kill && point != afterSendBeforeAck:
		// A cancelled relay finishes and marks the batch it holds.
		require.Zero(t, rep.Redeliveries, "a cancelled relay must mark what it published")
	case kill && !early && (point == afterAckBeforeMark || point == beforeMarkCommit):
		// Acknowledged but not marked before the lease ran out: the
		// successor published the batch again. (A relay that wakes early
		// retries its mark on a fresh connection and may publish nothing
		// twice; one still waiting for the broker keeps renewing its
		// lease, so nobody publishes its batch meanwhile.)
		require.Positive(t, rep.Redeliveries, "a batch published but never marked must be published again")
	}
}
