package consumer

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/dedupe"
	"github.com/d419a114/outbox/ordering"
)

// Config tunes a Processor and a Consumer. The zero value is valid.
type Config struct {
	// Schema holds the consumer's tables. Default outbox.DefaultSchema.
	Schema string
	// MaxAttempts is how often a record is tried in-process before it is
	// dead-lettered. A handler's statement timeout, lock timeout or
	// deadlock counts as a try while the database answers other work;
	// during an outage nothing counts and the record is handed back
	// after MaxAttempts tries in a row (see the package's README).
	// Such a failure dead-letters a record only once it has also lasted
	// ContentionSpan. Default 5.
	MaxAttempts int
	// ContentionSpan is how long a record's handler must keep failing
	// with a SQLSTATE that contention or a failover also causes (a
	// statement or lock timeout, a deadlock, a serialization failure, a
	// lost connection), counted from its first such failure, before it is
	// dead-lettered for it: MaxAttempts such tries alone do not suffice.
	// A healthy record that waits on a lock, or rides out a failover, is
	// retried with backoff until the span is over and applies when the
	// next try clears, instead of being dead-lettered after a second.
	// Meanwhile it holds its aggregate, and its partition in the
	// Consumer. Other failures (errors, panics, *HandlerTimeoutError) are
	// judged by MaxAttempts alone. Default 1 minute; negative: MaxAttempts
	// alone decides.
	ContentionSpan time.Duration
	// MinBackoff and MaxBackoff bound the exponential wait between tries,
	// which is jittered. Default 50ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// HandlerTimeout bounds one call of the handler (Handle, or HandleBatch
	// for a whole batch): its ctx carries the deadline. A handler that runs
	// out of it fails with a *HandlerTimeoutError, which counts as a failed
	// attempt: it is retried and then dead-lettered naming the timeout. Its
	// transaction is rolled back. A handler that ignores its ctx is still
	// waited for, holding its record (and, in the Consumer, its aggregate)
	// until it returns, except when its partition is revoked or Run ends:
	// see ShutdownGrace. Default 30s; negative means no bound.
	HandlerTimeout time.Duration
	// KeyFunc extracts the idempotency key of a record that has none of the
	// outbox-idempotency-key, outbox-event-id and Debezium id headers
	// (tried in that order). A record without a key is dead-lettered with
	// ErrNoKey. Default nil.
	KeyFunc func(*kgo.Record) (string, error)
	// GapPolicy says what happens to a record that arrives ahead of a gap
	// in its aggregate's sequence. Default ordering.GapPark.
	GapPolicy ordering.GapPolicy
	// FirstSeen says how an aggregate's first record is treated when its
	// sequence is above 1. Default ordering.FirstSeenStrict; see package
	// ordering for why.
	FirstSeen ordering.FirstSeenPolicy
	// MaxValueBytes dead-letters records with larger values before the
	// handler sees them. Default 16 MiB; negative means no limit.
	MaxValueBytes int
	// KeyRetention is how long processed keys are kept; the Consumer prunes
	// older ones and warns at start when the subscribed topics keep records
	// longer, or when ReplayWindow is longer. Default 7 days.
	KeyRetention time.Duration
	// ReplayWindow is how long after a failure operators may replay a dead
	// letter; only checked against KeyRetention. Default 0 (not checked).
	ReplayWindow time.Duration
	// BatchSize is how many records of a partition the Consumer applies in
	// one transaction: at Concurrency 1 consecutive ones; above, records of
	// distinct aggregates or consecutive records of one. Default 1. See
	// ProcessBatch, and BatchHandler for a handler that applies a batch in
	// one call.
	BatchSize int
	// Unordered declares that the handler needs no order: each record is
	// applied once (its idempotency key is still claimed), but sequence
	// headers are not checked, so nothing is parked behind a gap, a
	// dead letter holds nothing back, and [Message.Seq] is only
	// information. A Consumer on a share group (kgo.ShareGroup), which
	// delivers records in no order, requires it. Default false.
	Unordered bool
	// Concurrency is how many records (or batches) of one partition the
	// Consumer has in flight at once, never two of one aggregate, each
	// aggregate's in offset order. Records without aggregate headers are
	// ordered by their record key; records with neither go freely. 1, the
	// default, applies a partition's records strictly in offset order. The
	// pool of db needs about Concurrency connections per partition
	// assigned to this member to make use of it.
	Concurrency int
	// PartitionBuffer bounds the records the Consumer holds per partition,
	// waiting or in flight or done above the partition's lowest record not
	// done. When a partition's lane holds this many after a poll, fetching
	// of that partition alone pauses until half of them are done. The
	// pause waits until the Consumer has polled the rest of the fetch
	// franz-go holds of the partition (franz-go would drop those records
	// and fetch and decode them again after the resume), so a lane can go
	// over by one poll's records (MaxPollRecords) or by the rest of one
	// fetch of its partition, whichever is more: at most
	// kgo.FetchMaxPartitionBytes of records (1 MiB by default), which
	// franz-go held decoded in memory anyway. Default 1000.
	PartitionBuffer int
	// CommitInterval is how often the Consumer commits the offsets of the
	// records done; it also commits when partitions are revoked and when
	// Run returns. A crash redelivers what was done since the last commit,
	// and dedupe skips it. Default 1s.
	CommitInterval time.Duration
	// MaxPollRecords bounds the records one poll hands to the Consumer;
	// the poll loop blocks the group's rebalances while it hands them to
	// their lanes. It does not bound what a lane holds (see
	// PartitionBuffer): a partition's records left in franz-go's buffer
	// after a poll come first in the next one. Default 1000.
	MaxPollRecords int
	// PruneInterval is how often the Consumer prunes expired keys. Default
	// 1h; negative disables pruning.
	PruneInterval time.Duration
	// RequestPoll is how often the Consumer looks for operator requests
	// (package operator) addressed to its name, besides listening for
	// them on a connection of its own when db is a *pgxpool.Pool or
	// SessionConfig is set. Default
	// 1s; negative: the Consumer takes none up.
	RequestPoll time.Duration
	// SessionConfig is used for the connection that LISTENs for operator
	// requests (see RequestPoll), which needs a session of its own. Behind
	// a transaction pooler (PgBouncer pool_mode=transaction) point it at
	// the PostgreSQL server directly or at a session-mode pool. The
	// listener checks that it is a session; when it is not, it says so at
	// WARN once, naming [Config.SessionConfig], and does not listen: requests
	// are then taken up at the next RequestPoll, as polling is what
	// guarantees they are. Default: the pool's connection config. A
	// consumer with [Config.Route] leaves it nil and sets
	// [Target.SessionConfig] for each target instead.
	SessionConfig *pgx.ConnConfig
	// ShutdownGrace is how long the Consumer lets records in flight finish
	// after its context ends, or after their partition is revoked (keep it
	// well below the group's rebalance timeout, 60s by default); then
	// their handlers' contexts are cancelled, their transactions roll back
	// and their offsets are not committed, so they are redelivered. A
	// handler that ignores its ctx gets one second more; then the Consumer
	// ends its transaction's database session (the server rolls it back)
	// and goes on without waiting for it. Default 10s.
	ShutdownGrace time.Duration
	// Tracer observes each record's processing (and each batch's, when it
	// is a BatchTracer), for tracing and metrics adapters. Default nil.
	Tracer Tracer
	// Logger receives the runtime's logs. Default slog.Default().
	Logger *slog.Logger
	// Route, when set, makes Handle and New apply each record in the
	// target database that owns its aggregate; their database argument
	// must then be nil. Schema is the targets' default schema. Default
	// nil: one database.
	Route *Route
}

func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = outbox.DefaultSchema
	}
	if out.MaxAttempts == 0 {
		out.MaxAttempts = 5
	}
	if out.MinBackoff == 0 {
		out.MinBackoff = 50 * time.Millisecond
	}
	if out.MaxBackoff == 0 {
		out.MaxBackoff = 5 * time.Second
	}
	if out.HandlerTimeout == 0 {
		out.HandlerTimeout = 30 * time.Second
	}
	if out.ContentionSpan == 0 {
		out.ContentionSpan = time.Minute
	}
	if out.MaxValueBytes == 0 {
		out.MaxValueBytes = 16 << 20
	}
	if out.KeyRetention == 0 {
		out.KeyRetention = dedupe.DefaultRetention
	}
	if out.BatchSize == 0 {
		out.BatchSize = 1
	}
	if out.Concurrency == 0 {
		out.Concurrency = 1
	}
	if out.PartitionBuffer == 0 {
		out.PartitionBuffer = 1000
	}
	if out.CommitInterval == 0 {
		out.CommitInterval = time.Second
	}
	if out.MaxPollRecords == 0 {
		out.MaxPollRecords = 1000
	}
	if out.PruneInterval == 0 {
		out.PruneInterval = time.Hour
	}
	if out.RequestPoll == 0 {
		out.RequestPoll = time.Second
	}
	if out.ShutdownGrace == 0 {
		out.ShutdownGrace = 10 * time.Second
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	switch {
	case out.MaxAttempts < 1:
		return out, fmt.Errorf("consumer: MaxAttempts %d is below 1", out.MaxAttempts)
	case out.MinBackoff < 0 || out.MaxBackoff < out.MinBackoff:
		return out, fmt.Errorf("consumer: backoff bounds %s..%s are not a range", out.MinBackoff, out.MaxBackoff)
	case out.KeyRetention < 0:
		return out, fmt.Errorf("consumer: negative KeyRetention %s", out.KeyRetention)
	case out.ReplayWindow < 0:
		return out, fmt.Errorf("consumer: negative ReplayWindow %s", out.ReplayWindow)
	case out.BatchSize < 1:
		return out, fmt.Errorf("consumer: BatchSize %d is below 1", out.BatchSize)
	case out.Concurrency < 1:
		return out, fmt.Errorf("consumer: Concurrency %d is below 1", out.Concurrency)
	case out.PartitionBuffer < 1:
		return out, fmt.Errorf("consumer: PartitionBuffer %d is below 1", out.PartitionBuffer)
	case out.CommitInterval < 0:
		return out, fmt.Errorf("consumer: negative CommitInterval %s", out.CommitInterval)
	case out.MaxPollRecords < 1:
		return out, fmt.Errorf("consumer: MaxPollRecords %d is below 1", out.MaxPollRecords)
	case out.ShutdownGrace < 0:
		return out, fmt.Errorf("consumer: negative ShutdownGrace %s", out.ShutdownGrace)
	case out.GapPolicy < ordering.GapPark || out.GapPolicy > ordering.GapIgnore:
		return out, fmt.Errorf("consumer: unknown GapPolicy %d; use ordering.GapPark, GapFail or GapIgnore", int(out.GapPolicy))
	}
	return out, nil
}
