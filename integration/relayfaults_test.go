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
	"github.com/d419a114/outbox/producer"
)

// recordFailuresMarker identifies the relay's failure-recording statement
// (tables.Relay.RecordFailures in internal/tables/relay.go).
const recordFailuresMarker = "SET attempts = e.attempts + 1"

// settleBreaker is a pgx tracer on a relay's connections that stops the
// relay after its first claim until release is called, and makes its first
// attempt to record failures fail: it terminates that connection's backend
// as the batch starts, as a database blip would.
type settleBreaker struct {
	terminate func(pid uint32)
	claimed   chan struct{}
	release   chan struct{}
	claims    atomic.Int32
	broke     atomic.Bool
}

func (b *settleBreaker) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (b *settleBreaker) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (b *settleBreaker) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	ctx = withClaimOutcome(ctx, data.Batch)
	for _, q := range data.Batch.QueuedQueries {
		if strings.Contains(q.SQL, recordFailuresMarker) && b.broke.CompareAndSwap(false, true) {
			b.terminate(conn.PgConn().PID())
		}
	}
	return ctx
}

func (b *settleBreaker) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	noteClaim(ctx, data)
}

func (b *settleBreaker) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	if claimLeased(ctx, data) && b.claims.Add(1) == 1 {
		close(b.claimed)
		<-b.release
	}
}

// TestScenarioFailedPublishThenFailedSettleKeepsOrder checks that seq 2 of
// an aggregate never goes on the wire before seq 1 when recording seq 1's
// failure fails too.
//
// Walkthrough of the hazard:
//  1. The relay claims [seq 1]: the row is leased for Lease.
//  2. Seq 2 commits.
//  3. The publish of seq 1 fails (a permanent broker error here; any
//     error the client gives up on will do).
//  4. settle's transaction, which would record the failure (attempts + 1)
//     and clear the lease, fails: the database connection drops.
//  5. The next claim must not take seq 2 while seq 1 is leased and
//     unacknowledged, although seq 1 still has attempts = 0: the claim
//     holds back rows behind a leased earlier row of their aggregate.
//  6. When the lease ends, seq 1 goes out, then seq 2.
func TestScenarioFailedPublishThenFailedSettleKeepsOrder(t *testing.T) {
	t.Parallel()
	rng := scenarioRand(t)
	s := newScenario(t, rng, kafkatest.NewFake(t), 1)
	s.startConsumer()
	_, ok := s.attempt([]producer.Event{s.event("x")}, false)
	require.True(t, ok)

	fault := s.broker.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.InvalidRecord})
	brk := &settleBreaker{claimed: make(chan struct{}), release: make(chan struct{})}
	brk.terminate = func(pid uint32) {
		_, err := s.db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, int32(pid))
		assertNoError(t, err)
	}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(brk.release) }) }
	s.startRelay("a", scenarioRelayConfig(), brk)
	t.Cleanup(release) // registered after the relay's stop, so it runs before it

	waitClosed(t, brk.claimed, 30*time.Second, "the first claim")
	_, ok = s.attempt([]producer.Event{s.event("x")}, false) // seq 2, committed after seq 1 was claimed
	require.True(t, ok)
	release()
	s.drain(60 * time.Second)
	require.Equal(t, 1, fault.Hits(), "the publish of seq 1 failed once")
	require.True(t, brk.broke.Load(), "the settle of the failed publish was broken")
	s.check()
}

// TestScenarioPublishOutlivingLeaseKeepsItsRows checks that a batch whose
// publish waits on an unreachable broker keeps its rows reserved.
//
// The client neither delivers nor fails records that may have reached the
// broker (franz-go fails buffered records on a cancelled context only when
// it is safe to, and retries without a bound by default), so a publish can
// last longer than PublishTimeout and than the lease. Were the lease to run
// out meanwhile, a successor taking over the buckets after the relay's
// session died would publish the same rows at once. The relay renews the
// batch's lease while it waits.
//
// The check: while the broker is down, no row may sit undelivered, without
// a recorded failure, with its lease over.
func TestScenarioPublishOutlivingLeaseKeepsItsRows(t *testing.T) {
	rng := scenarioRand(t)
	b := restartableBroker(t)
	if b.Fake == nil {
		t.Skip("needs kfake: the broker is kept down for seconds")
	}
	t.Parallel()
	s := newScenario(t, rng, b.Broker, 1)
	cfg := scenarioRelayConfig()
	s.startRelay("a", cfg, nil)
	s.startConsumer()
	_, ok := s.attempt([]producer.Event{s.event("x")}, false)
	require.True(t, ok)
	s.waitConsumed(nil, 30*time.Second)

	var overdue int
	b.restartWith(t, 3*cfg.Lease, func() {
		if _, ok := s.attempt([]producer.Event{s.event("x")}, false); !ok {
			t.Error("write failed")
			return
		}
		deadline := time.Now().Add(2 * cfg.Lease)
		for time.Now().Before(deadline) && overdue == 0 {
			err := s.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+s.db.Table("events")+`
				WHERE published_at IS NULL AND attempts = 0 AND leased_until < now()`).Scan(&overdue)
			assertNoError(t, err)
			time.Sleep(50 * time.Millisecond)
		}
	})
	s.drain(60 * time.Second)
	s.check()
	require.Zero(t, overdue, "an event stayed claimed, unpublished and unfailed after its lease ended (Lease %s, PublishTimeout %s)", cfg.Lease, cfg.PublishTimeout)
}
