package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// claimedEvent is an outbox row leased to this relay.
type claimedEvent struct {
	id                int64
	eventID           string
	idempotencyKey    string
	aggregateType     string
	aggregateID       string
	seq               int64
	eventType         string
	topic             *string
	contentType       *string
	payload           []byte
	headers           map[string]string
	createdAt         time.Time
	attempts          int
	permanentFailures int
	bucketHash        int32
	// leasedUntil is the lease the claim set; the batch's rows share it, and
	// settle touches only rows that still carry it.
	leasedUntil time.Time
}

// scanClaimed scans a row of tables.Relay.Claim.
func scanClaimed(row pgx.CollectableRow) (*claimedEvent, error) {
	e := &claimedEvent{}
	err := row.Scan(&e.id, &e.eventID, &e.idempotencyKey, &e.aggregateType, &e.aggregateID,
		&e.seq, &e.eventType, &e.topic, &e.contentType, &e.payload, &e.headers,
		&e.createdAt, &e.attempts, &e.permanentFailures, &e.bucketHash, &e.leasedUntil)
	return e, err
}

// errHeldBack marks events of a batch that were not sent because an earlier
// event of their aggregate was not acknowledged (or went to another topic).
var errHeldBack = errors.New("held back behind an earlier event of its aggregate")

// heldTopic is no topic's name: publish maps an aggregate to it once the
// aggregate's later events in the batch are held back.
const heldTopic = "\x00"

// outcome is what the broker said about one event of a batch.
type outcome struct {
	err       error
	topic     string
	partition int32
}

// publish sends the batch and waits for every acknowledgement; out[i].err
// is nil when batch[i] was acknowledged.
//
// All sent records are in flight at once. That keeps per-aggregate order
// because an aggregate's records share a key and so a partition, and the
// idempotent producer fails the later records of a partition buffered
// behind one that fails, so seq n+1 does not land unless seq n did. That
// argument holds only within one topic, and only for records the client
// buffers: when an aggregate's events in the batch change topic, the rest
// of that aggregate waits for the next batch, and a record the client
// would fail before buffering it (too large for it) is not sent at all,
// holding the rest of its aggregate likewise. Whatever the client does
// besides, settleOnce never marks an event delivered behind an earlier
// one of its aggregate that failed.
func (r *Relay) publish(ctx context.Context, batch []*claimedEvent, recs []*kgo.Record) []outcome {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	out := make([]outcome, len(batch))
	topicOf := map[[2]string]string{}
	var wg sync.WaitGroup
	for i, e := range batch {
		topic := recs[i].Topic
		out[i] = outcome{topic: topic, partition: -1}
		agg := [2]string{e.aggregateType, e.aggregateID}
		if first, seen := topicOf[agg]; !seen {
			topicOf[agg] = topic
		} else if first != topic {
			out[i].err = errHeldBack
			topicOf[agg] = heldTopic // hold the rest of this aggregate too
			continue
		}
		if err := r.limit.recordTooLarge(recs[i]); err != nil {
			out[i].err = err
			topicOf[agg] = heldTopic
			continue
		}
		wg.Add(1)
		r.client.Produce(ctx, recs[i], func(rec *kgo.Record, err error) {
			out[i].err, out[i].partition = err, rec.Partition
			wg.Done()
		})
	}
	// Flush sends what the client is lingering on at once: the relay
	// waits for this batch anyway, so lingering only adds latency. The
	// batch waits for its own records' promises, not for the flush: a
	// flush waits for every record the client buffers, and a client
	// shared by a Fleet's shards (or other producers) would make this
	// batch wait for theirs. The flush ends with the batch.
	flushCtx, endFlush := context.WithCancel(ctx)
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		_ = r.client.Flush(flushCtx)
	}()
	wg.Wait()
	endFlush()
	<-flushed
	r.explainMissingTopics(context.WithoutCancel(ctx), out)
	r.failing.observe(out, time.Now())
	return out
}

// missingTopicError is a publish error of a topic that the broker says
// does not exist. The client reports UNKNOWN_TOPIC_OR_PARTITION only for a
// record's first tries; after that its records wait for the topic until
// the publish times out, and the error says only "context deadline
// exceeded". It stays retryable: creating the topic fixes it.
type missingTopicError struct {
	topic string
	err   error
}

func (e *missingTopicError) Error() string {
	return fmt.Sprintf("topic %q does not exist (UNKNOWN_TOPIC_OR_PARTITION); create it, or enable auto-creation (the broker's auto.create.topics.enable and the relay client's kgo.AllowAutoTopicCreation): %v", e.topic, e.err)
}

func (e *missingTopicError) Unwrap() error { return e.err }

// explainMissingTopics asks the broker, once per topic, about the topics
// of out whose records failed in a way a missing topic fails them, and
// wraps the errors of the topics that do not exist in a
// *missingTopicError. A broker that does not answer leaves out as it is.
func (r *Relay) explainMissingTopics(ctx context.Context, out []outcome) {
	missing := map[string]bool{}
	for i := range out {
		o := &out[i]
		if o.err == nil || !mayBeMissingTopic(o.err) {
			continue
		}
		gone, asked := missing[o.topic]
		if !asked {
			gone = r.topicMissing(ctx, o.topic)
			missing[o.topic] = gone
		}
		if gone {
			o.err = &missingTopicError{topic: o.topic, err: o.err}
		}
	}
}

// mayBeMissingTopic reports whether err is how the client fails a record
// of a topic that does not exist.
func mayBeMissingTopic(err error) bool {
	return errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, kgo.ErrRecordTimeout) || errors.Is(err, kgo.ErrRecordRetries)
}

// topicMissing asks the broker for topic's metadata, without creating it,
// and reports whether the broker says it does not exist.
func (r *Relay) topicMissing(ctx context.Context, topic string) bool {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, r.client)
	if err != nil || len(resp.Topics) != 1 {
		return false
	}
	return resp.Topics[0].ErrorCode == kerr.UnknownTopicOrPartition.Code
}

func (r *Relay) topicFor(e *claimedEvent) string {
	switch {
	case e.topic != nil:
		return *e.topic
	case r.cfg.Topic != "":
		return r.cfg.Topic
	default:
		return e.aggregateType
	}
}

// record is e's record on topic: the wire contract, which Record holds.
func (r *Relay) record(e *claimedEvent, topic string) *kgo.Record {
	ev := Event{
		AggregateType: e.aggregateType, AggregateID: e.aggregateID, EventType: e.eventType,
		Payload: e.payload, Headers: e.headers, IdempotencyKey: e.idempotencyKey,
	}
	if e.contentType != nil {
		ev.ContentType = *e.contentType
	}
	return Record(topic, ev, Stamp{EventID: e.eventID, Seq: e.seq, OccurredAt: e.createdAt})
}

// retryable reports whether a publish error may go away by itself: the
// broker or a leader unavailable, a time-out, a connection lost. Anything
// else (record too large, invalid topic, not authorised) is permanent and
// counts towards MaxAttempts.
func retryable(err error) bool {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, kgo.ErrMaxBuffered):
		return true
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Retriable
	}
	// Errors outside the protocol's table are the client's own: dial
	// failures, closed connections. Treat them as transient.
	return true
}

// failure is the outcome to record for an event that was not acknowledged.
type failure struct {
	id        int64
	permanent bool
	err       string
	delay     time.Duration
}

// settle records a published batch's outcome; see settleOnce. A failure is
// retried for up to half the lease: after that the rows' lease is what
// keeps their aggregates on hold until they are claimed again, in order.
func (r *Relay) settle(ctx context.Context, batch []*claimedEvent, results []outcome, lease time.Time) (PublishResult, error) {
	deadline := time.Now().Add(r.cfg.Lease / 2)
	for attempt := 1; ; attempt++ {
		res, err := r.settleOnce(ctx, batch, results, lease, attempt == 1)
		if err == nil {
			return res, nil
		}
		delay := r.retry.Delay(attempt)
		if time.Now().Add(delay).After(deadline) {
			return res, err
		}
		r.log.WarnContext(ctx, "relay: record publish outcome, will retry", slog.String("error", err.Error()))
		time.Sleep(delay)
	}
}

// settleOnce records the outcome in one transaction. Acknowledged rows are
// marked delivered, unless an earlier row of their aggregate was not
// acknowledged. Per aggregate, the first unacknowledged row has its
// attempt counted and a backoff set, and the rows behind it, acknowledged
// or not, just lose their lease: they were not the cause. Per partition, likewise, only the first
// failed row is charged: when one record fails, the client fails every
// record buffered behind it on that partition with the same error, and a
// poison event must not count against healthy aggregates that share its
// partition. Rows whose permanent failures reached MaxAttempts move to the
// dead events.
func (r *Relay) settleOnce(ctx context.Context, batch []*claimedEvent, results []outcome, lease time.Time, logFailures bool) (PublishResult, error) {
	var delivered, released []int64
	var failed []failure
	blocked := map[[2]string]bool{}
	charged := map[[2]string]bool{}
	for i, e := range batch {
		agg := [2]string{e.aggregateType, e.aggregateID}
		res := results[i]
		part := [2]string{res.topic, strconv.Itoa(int(res.partition))}
		switch {
		case res.err == nil && !blocked[agg]:
			// Acknowledged, and so was every earlier event of its
			// aggregate in the batch.
			delivered = append(delivered, e.id)
		case res.err == nil:
			// Acknowledged behind an earlier event of its aggregate that
			// failed: the client let it out of order. It is on the topic,
			// but marking it would make the aggregate's sequence skip the
			// failed one for good; left undelivered, it waits behind that
			// one and is published again after it, a duplicate that
			// consumers drop once they applied it (those that check
			// sequences park this copy until then).
			released = append(released, e.id)
			if logFailures {
				r.log.ErrorContext(ctx, "relay: an event was acknowledged although an earlier event of its aggregate in the batch failed; it reached the topic out of order, is not marked delivered, and is published again after the earlier one",
					slog.String("topic", res.topic), slog.Int64("event_id", e.id), slog.String("aggregate_type", e.aggregateType),
					slog.String("aggregate_id", e.aggregateID), slog.Int64("seq", e.seq))
			}
		case blocked[agg] || errors.Is(res.err, errHeldBack) || (res.partition >= 0 && charged[part]):
			blocked[agg] = true
			released = append(released, e.id)
		default:
			blocked[agg] = true
			charged[part] = true
			f := failure{id: e.id, permanent: !retryable(res.err), err: res.err.Error()}
			f.delay = r.retry.Delay(e.attempts + 1)
			failed = append(failed, f)
			if logFailures {
				r.log.WarnContext(ctx, "relay: publish failed",
					slog.String("topic", res.topic), slog.Int64("event_id", e.id), slog.String("aggregate_type", e.aggregateType),
					slog.String("aggregate_id", e.aggregateID), slog.Int64("seq", e.seq),
					slog.Bool("permanent", f.permanent), slog.Int("attempts", e.attempts+1),
					slog.Duration("backoff", f.delay), slog.String("error", f.err))
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Lease)
	defer cancel()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return PublishResult{}, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	b := &pgx.Batch{}
	if len(delivered) > 0 {
		b.Queue(r.sql.MarkDelivered, delivered)
		b.Queue(r.sql.AddActivity, "delivered", r.cfg.RelayID, time.Now(), len(delivered))
		if r.activityPruned.Load() < time.Now().Add(-time.Hour).Unix() {
			r.activityPruned.Store(time.Now().Unix())
			b.Queue(r.sql.PruneActivity)
		}
	}
	if len(released) > 0 {
		b.Queue(r.sql.Release, released, lease)
	}
	var deadRows []deadMove
	if len(failed) > 0 {
		ids := make([]int64, len(failed))
		perm := make([]int32, len(failed))
		msgs := make([]string, len(failed))
		delays := make([]int64, len(failed))
		for i, f := range failed {
			ids[i], msgs[i], delays[i] = f.id, f.err, f.delay.Milliseconds()
			if f.permanent {
				perm[i] = 1
			}
		}
		b.Queue(r.sql.RecordFailures, ids, perm, msgs, delays, lease)
		b.Queue(r.sql.MoveDead, ids, int32(r.cfg.MaxAttempts), r.cfg.OnDead == HoldAggregate).Query(func(rows pgx.Rows) error { //nolint:gosec // NewRelay keeps MaxAttempts within int32
			var err error
			deadRows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[deadMove])
			return err
		})
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return PublishResult{}, fmt.Errorf("mark batch: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return PublishResult{}, fmt.Errorf("commit batch marks: %w", err)
	}
	for _, d := range deadRows {
		r.log.ErrorContext(ctx, "relay: event exhausted its attempts and moved to dead events; replay or discard it",
			slog.Int64("event_id", d.ID), slog.String("aggregate_type", d.AggregateType),
			slog.String("aggregate_id", d.AggregateID), slog.Int64("seq", d.Seq),
			slog.Bool("holds_aggregate", r.cfg.OnDead == HoldAggregate), slog.String("error", d.LastError))
	}
	return PublishResult{Delivered: len(delivered), Failed: len(failed), Dead: len(deadRows)}, nil
}

type deadMove struct {
	ID            int64
	AggregateType string
	AggregateID   string
	Seq           int64
	LastError     string
}
