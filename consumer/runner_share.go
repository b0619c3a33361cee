package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrDeliveryLimit is the cause of the dead letter the Consumer writes on a
// share group for a record it could not finish on its last delivery: the
// broker would not deliver it again, so the letter keeps it for Replay.
var ErrDeliveryLimit = errors.New("consumer: not done on the share group's last delivery")

// shareLoop runs the Consumer on a share group: each poll's records go to
// up to Concurrency workers (BatchSize records of one partition at a
// time, in no order), each record is acknowledged by its outcome, and the
// next poll waits until every record of this one is acknowledged, because
// franz-go accepts whatever a poll left unacknowledged at the next one.
// It returns nil when ctx ends and ErrClosed when the client was closed.
func (c *Consumer) shareLoop(ctx context.Context) error {
	limit := c.deliveryLimit(ctx)
	stopFetching := context.AfterFunc(ctx, c.stopAcquiring)
	defer stopFetching()
	for {
		fetches := c.client.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() {
			return ErrClosed
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				c.log.WarnContext(ctx, "consumer: share fetch failed", slog.String("topic", topic), slog.Int("partition", int(partition)), slog.String("error", err.Error()))
			}
		})
		var batches [][]*kgo.Record
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			for recs := p.Records; len(recs) > 0; {
				n := min(len(recs), c.cfg.BatchSize)
				batches = append(batches, recs[:n])
				recs = recs[n:]
			}
		})
		if len(batches) > 0 {
			c.shareRound(ctx, batches, limit)
		}
		if ctx.Err() != nil {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			err := c.client.FlushAcks(fctx)
			cancel()
			if err != nil {
				c.log.WarnContext(ctx, "consumer: could not send the last acknowledgements; their records are delivered again after the broker's acquisition lock runs out, and dedupe skips those applied",
					slog.String("error", err.Error()))
			}
			return nil
		}
	}
}

// shareRound applies batches with up to Concurrency at once and returns
// when each of their records is acknowledged. When stop ends, batches not
// started are released and those in flight get ShutdownGrace before their
// handlers' contexts are cancelled.
func (c *Consumer) shareRound(stop context.Context, batches [][]*kgo.Record, limit int32) {
	open := openSet{parent: &c.open}
	work, cancelWork := context.WithCancel(context.Background())
	defer cancelWork()
	work = withOpenSet(work, &open)
	var wg sync.WaitGroup
	slots := make(chan struct{}, c.cfg.Concurrency)
	for _, b := range batches {
		select {
		case slots <- struct{}{}:
		case <-stop.Done():
		}
		if stop.Err() != nil {
			c.unfinished(stop, b, stop.Err(), limit)
			continue
		}
		wg.Go(func() {
			defer func() { <-slots }()
			c.applyShared(stop, work, b, limit)
		})
	}
	idle := make(chan struct{})
	go func() {
		wg.Wait()
		close(idle)
	}()
	select {
	case <-idle:
		return
	case <-stop.Done():
	}
	if within(idle, c.cfg.ShutdownGrace) {
		return
	}
	cancelWork()
	if within(idle, abandonAfter) {
		return
	}
	c.log.ErrorContext(stop, "consumer: share group handlers did not return after ShutdownGrace and the cancel of their contexts; rolling back their transactions",
		slog.Duration("shutdown_grace", c.cfg.ShutdownGrace))
	if err := endSessions(context.WithoutCancel(stop), c.log, open.pids()); err != nil {
		c.log.ErrorContext(stop, "consumer: could not end the sessions of abandoned transactions; they end when their handlers return",
			slog.String("error", err.Error()))
	}
	<-idle
}

// applyShared applies recs (one partition's, together when there are more
// than one) and acknowledges each: applied and duplicate records are
// accepted, dead-lettered ones rejected (the letter keeps them). A record
// that is not done is retried alone with backoff until stop ends; then it
// is unfinished.
func (c *Consumer) applyShared(stop, work context.Context, recs []*kgo.Record, limit int32) {
	var res []Result
	if len(recs) > 1 {
		// The records after those with a result are not done; they are
		// tried alone below.
		res, _ = c.proc.ProcessBatch(work, recs)
	}
	for i, r := range res {
		c.client.MarkAcks(ackFor(r), recs[i])
	}
	for _, rec := range recs[len(res):] {
		r, err := c.proc.Process(work, rec)
		for attempt := 1; err != nil && stop.Err() == nil && work.Err() == nil; attempt++ {
			c.log.WarnContext(work, "consumer: record not done, retrying", slog.String("topic", rec.Topic),
				slog.Int("partition", int(rec.Partition)), slog.Int64("offset", rec.Offset), slog.String("error", err.Error()))
			if sleep(stop, c.cfg.backoff(attempt)) != nil {
				break
			}
			r, err = c.proc.Process(work, rec)
		}
		if err != nil {
			c.unfinished(stop, []*kgo.Record{rec}, err, limit)
			continue
		}
		c.client.MarkAcks(ackFor(r), rec)
	}
}

// ackFor is how a record with result r is acknowledged.
func ackFor(r Result) kgo.AckStatus {
	if r.Outcome == DeadLettered {
		return kgo.AckReject
	}
	return kgo.AckAccept
}

// unfinished acknowledges recs, which the Consumer stops before they are
// done (cause says why). A record with deliveries left is released, for
// the broker to deliver again. On its last delivery (or when the limit is
// unknown) the broker would archive it, so it is dead-lettered first and
// rejected; if even that fails it is released and logged as lost to this
// consumer.
func (c *Consumer) unfinished(ctx context.Context, recs []*kgo.Record, cause error, limit int32) {
	c.stopAcquiring()
	for _, rec := range recs {
		if limit > 0 && rec.DeliveryCount() < limit {
			c.client.MarkAcks(kgo.AckRelease, rec)
			continue
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		r, err := c.proc.deadLetterRecord(dctx, rec, fmt.Errorf("%w (delivery %d of %d): %w", ErrDeliveryLimit, rec.DeliveryCount(), limit, cause))
		cancel()
		if err != nil {
			c.log.ErrorContext(ctx, "consumer: record not done on its last share group delivery, and its dead letter could not be written; the broker archives it and this consumer never applies it",
				slog.String("topic", rec.Topic), slog.Int("partition", int(rec.Partition)), slog.Int64("offset", rec.Offset),
				slog.Int("delivery", int(rec.DeliveryCount())), slog.String("error", err.Error()))
			c.client.MarkAcks(kgo.AckRelease, rec)
			continue
		}
		c.client.MarkAcks(ackFor(r), rec)
	}
}

// stopAcquiring pauses the client's fetching when Run stops, before it
// releases anything: a record the client acquired after that would wait,
// unpolled, until the client is closed, and lose a delivery.
func (c *Consumer) stopAcquiring() {
	c.paused.Do(func() { c.client.PauseFetchTopics(c.client.GetConsumeTopics()...) })
}

// deliveryLimit reads the share group's share.delivery.count.limit from
// the broker; 0 when it cannot, and then every delivery counts as the
// last.
func (c *Consumer) deliveryLimit(ctx context.Context) int32 {
	group, _ := c.client.OptValue(kgo.ShareGroup).(string)
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	res.ConfigNames = []string{"share.delivery.count.limit"}
	req.Resources = append(req.Resources, res)
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	limit, err := func() (int32, error) {
		resp, err := req.RequestWith(cctx, c.client)
		if err != nil {
			return 0, err
		}
		for _, r := range resp.Resources {
			if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
				return 0, err
			}
			for _, cfg := range r.Configs {
				if cfg.Name == "share.delivery.count.limit" && cfg.Value != nil {
					n, err := strconv.ParseInt(*cfg.Value, 10, 32)
					return int32(n), err
				}
			}
		}
		return 0, errors.New("the broker did not report share.delivery.count.limit")
	}()
	if err != nil {
		c.log.WarnContext(ctx, "consumer: could not read the share group's delivery limit; a record stopped before it is done is dead-lettered instead of released",
			slog.String("group", group), slog.String("error", err.Error()))
		return 0
	}
	return limit
}
