package outboxprom

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/dedupe"
	"github.com/d419a114/outbox/producer"
)

// LagReader reads consumer groups' lag per partition; *kadm.Client
// (kadm.NewClient(client)) is one.
type LagReader interface {
	Lag(ctx context.Context, groups ...string) (kadm.DescribedGroupLags, error)
}

// TopicConfigReader reads topics' configs; *kadm.Client
// (kadm.NewClient(client)) is one.
type TopicConfigReader interface {
	DescribeTopicConfigs(ctx context.Context, topics ...string) (kadm.ResourceConfigs, error)
}

// HealthConfig says what a HealthCollector samples and how often. The
// zero value samples the producer side of outbox.DefaultSchema every 30s.
type HealthConfig struct {
	// Schema holds the outbox tables. Default outbox.DefaultSchema.
	Schema string
	// SkipProducer leaves out the producer side (undelivered and dead
	// events), for a service that only consumes. Default false.
	SkipProducer bool
	// Consumers names the consumers whose dead letters, parked records and
	// processed keys are sampled. Default none.
	Consumers []string
	// Lag reads the lag of Groups from the broker. Default nil: no group
	// lag; it must be set when Groups is.
	Lag LagReader
	// Groups names the consumer groups whose lag per partition is sampled.
	// Default none; it must be set when Lag is.
	Groups []string
	// Topics names the topics whose retention.ms is sampled through
	// TopicConfigs, as outbox_topic_retention_seconds (-1 for a topic that
	// keeps records forever), to compare with KeyRetention: a record
	// redelivered after its key was pruned is applied again. Default none;
	// it must be set when TopicConfigs is.
	Topics []string
	// TopicConfigs reads the retention of Topics. Default nil; it must be
	// set when Topics is.
	TopicConfigs TopicConfigReader
	// KeyRetention is the Consumers' consumer.Config.KeyRetention,
	// reported for each as outbox_consumer_key_retention_seconds. Default
	// dedupe.DefaultRetention, the consumer's own default.
	KeyRetention time.Duration
	// Interval is the least time between the end of one sample and the
	// start of the next: scrapes within it are served the last sample,
	// however many there are. A failed read is kept as long, so a database
	// that is down is not asked again on every scrape. Default 30s.
	Interval time.Duration
	// Timeout bounds one sample: its reads run at once, each on a
	// connection of its own, and one that has not finished by then fails
	// (its source reports outbox_health_up 0). Default 5s.
	Timeout time.Duration
	// Logger receives a warning for each read that fails. Default
	// slog.Default().
	Logger *slog.Logger
}

// HealthCollector is a prometheus.Collector of the outbox's state as only
// the database and the broker know it: the producer side's
// producer.Inspector.Health, each named consumer's consumer.Inspector.Health
// and, when configured, consumer group lag per partition. Register it on a
// prometheus.Registerer; names.go lists its metrics.
//
// It samples on scrape, not on a timer of its own: there is nothing to
// start or stop, no goroutine outlives a scrape, and nothing is read while
// nobody scrapes. A scrape that finds the last sample older than Interval
// takes a new one, bounded by Timeout; scrapes that arrive meanwhile wait
// for that sample instead of reading again. So the database is read at
// most once per Interval however often it is scraped, and no scrape waits
// much longer than Timeout (pgx and kadm give up at the deadline). A
// source whose read failed reports outbox_health_up 0 and none of its
// other metrics until a read succeeds, rather than numbers that may no
// longer be true.
type HealthCollector struct {
	cfg HealthConfig
	log *slog.Logger
	// producer and consumers read the producer's and the consumers'
	// tables of cfg.Schema.
	producer  *producer.Inspector
	consumers *consumer.Inspector

	// mu is held by the scrape that takes a sample, and last is read and
	// written under it.
	mu   sync.Mutex
	last *healthSample

	up, undelivered, undeliveredAge, dead, relaysLive, membersLive *prometheus.Desc
	cdcSlotActive, cdcRetainedWAL                                  *prometheus.Desc
	letters, letterAge                                             *prometheus.Desc
	parkedAggregates, parkedRecords, parkedAge, keys, keyAge       *prometheus.Desc
	groupLag                                                       *prometheus.Desc
	keyRetention, topicRetention                                   *prometheus.Desc
}

var _ prometheus.Collector = (*HealthCollector)(nil)

// NewHealthCollector validates cfg (nil means defaults) and returns a
// HealthCollector that reads db, such as the *pgxpool.Pool the service's
// relay or consumers use (any outbox.DB); a sample holds one of its connections per source
// for a moment. It reads nothing until it is scraped.
func NewHealthCollector(db outbox.DB, cfg *HealthConfig) (*HealthCollector, error) {
	if db == nil {
		return nil, errors.New("outboxprom: NewHealthCollector needs a database; got nil")
	}
	c := HealthConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Interval < 0 || c.Timeout < 0 {
		return nil, fmt.Errorf("outboxprom: HealthConfig.Interval (%s) and Timeout (%s) must not be negative", c.Interval, c.Timeout)
	}
	if c.Interval == 0 {
		c.Interval = 30 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	if (c.Lag == nil) != (len(c.Groups) == 0) {
		return nil, errors.New("outboxprom: HealthConfig.Lag and Groups go together; set both for group lag, or neither")
	}
	if (c.TopicConfigs == nil) != (len(c.Topics) == 0) {
		return nil, errors.New("outboxprom: HealthConfig.TopicConfigs and Topics go together; set both for topic retention, or neither")
	}
	if c.KeyRetention < 0 {
		return nil, fmt.Errorf("outboxprom: HealthConfig.KeyRetention (%s) must not be negative", c.KeyRetention)
	}
	if c.KeyRetention == 0 {
		c.KeyRetention = dedupe.DefaultRetention
	}
	if err := distinct("Topics", c.Topics); err != nil {
		return nil, err
	}
	if err := distinct("Consumers", c.Consumers); err != nil {
		return nil, err
	}
	if err := distinct("Groups", c.Groups); err != nil {
		return nil, err
	}
	if c.SkipProducer && len(c.Consumers) == 0 && len(c.Groups) == 0 && len(c.Topics) == 0 {
		return nil, errors.New("outboxprom: HealthConfig has SkipProducer and no Consumers or Groups; there is nothing to sample")
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	reads, err := producer.NewInspector(db, c.Schema)
	if err != nil {
		return nil, fmt.Errorf("outboxprom: HealthConfig.Schema: %w", err)
	}
	consumers, err := consumer.NewInspector(db, c.Schema)
	if err != nil {
		return nil, fmt.Errorf("outboxprom: HealthConfig.Schema: %w", err)
	}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &HealthCollector{cfg: c, log: log, producer: reads, consumers: consumers,
		up: desc(HealthUp, "1 when the last sample of the source was read, 0 when reading it failed (its other metrics are then left out).",
			LabelSource, LabelName),
		undelivered:    desc(EventsUndelivered, "Events the broker has not acknowledged."),
		undeliveredAge: desc(EventsUndeliveredOldestAge, "Age of the oldest undelivered event; 0 when there is none."),
		dead:           desc(EventsDead, "Events that exhausted their attempts and wait for a replay or discard."),
		relaysLive:     desc(RelaysLive, "Relay instances of the schema that are alive."),
		membersLive:    desc(ConsumerMembersLive, "Processes running a Consumer of the consumer, by their recent beats.", LabelConsumer),
		cdcSlotActive:  desc(CDCSlotActive, "In CDC mode: 1 while a connector reads the replication slot, 0 when none does or the slot is gone."),
		cdcRetainedWAL: desc(CDCRetainedWAL, "In CDC mode: bytes of WAL the replication slot keeps from removal."),
		letters: desc(ConsumerDeadLetters, "Open dead letters, by consumer, topic and reason.",
			LabelConsumer, LabelTopic, LabelReason),
		letterAge: desc(ConsumerDeadLetterOldestAge, "How long the oldest open dead letter of the consumer, topic and reason has been open.",
			LabelConsumer, LabelTopic, LabelReason),
		parkedAggregates: desc(ConsumerParkedAggregates, "Aggregates with records parked behind a gap or a dead letter.", LabelConsumer),
		parkedRecords:    desc(ConsumerParkedRecords, "Records parked behind a gap or a dead letter.", LabelConsumer),
		parkedAge:        desc(ConsumerParkedOldestAge, "How long the oldest parked record has waited; 0 when none is parked.", LabelConsumer),
		keys:             desc(ConsumerProcessedKeys, "Processed keys kept for dedupe.", LabelConsumer),
		keyAge:           desc(ConsumerProcessedKeyOldestAge, "Age of the oldest processed key, how far back dedupe reaches; 0 when there is none.", LabelConsumer),
		groupLag: desc(ConsumerGroupLag, "Records the consumer group is behind the end of the partition.",
			LabelGroup, LabelTopic, LabelPartition),
		keyRetention:   desc(ConsumerKeyRetention, "How long the consumer keeps processed keys (its Config.KeyRetention, as configured here).", LabelConsumer),
		topicRetention: desc(TopicRetention, "The topic's retention.ms in seconds; -1 when it keeps records forever.", LabelTopic),
	}, nil
}

// distinct fails unless names are non-empty and distinct: each becomes a
// label value, and two series of one name and labels break the scrape.
func distinct(field string, names []string) error {
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if n == "" || seen[n] {
			return fmt.Errorf("outboxprom: HealthConfig.%s must hold distinct, non-empty names; got %q", field, names)
		}
		seen[n] = true
	}
	return nil
}

// Describe sends the descriptors of every metric the collector can report.
func (h *HealthCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{h.up, h.undelivered, h.undeliveredAge, h.dead, h.relaysLive, h.membersLive, h.cdcSlotActive, h.cdcRetainedWAL, h.letters, h.letterAge,
		h.parkedAggregates, h.parkedRecords, h.parkedAge, h.keys, h.keyAge, h.groupLag, h.keyRetention, h.topicRetention} {
		ch <- d
	}
}

// Collect sends the metrics of the last sample, taking a new one first
// when it is older than Interval; see HealthCollector.
func (h *HealthCollector) Collect(ch chan<- prometheus.Metric) {
	s := h.sample()
	emit := func(d *prometheus.Desc, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	up := func(ok bool, source, name string) bool {
		emit(h.up, boolValue(ok), source, name)
		return ok
	}
	if p := s.producer; p != nil && up(p.ok, sourceProducer, "") {
		emit(h.undelivered, float64(p.v.Undelivered))
		emit(h.undeliveredAge, p.v.OldestUndelivered.Seconds())
		emit(h.dead, float64(p.v.Dead))
		emit(h.relaysLive, float64(p.v.relaysLive))
		if p.v.Dispatch == producer.DispatchCDC {
			emit(h.cdcSlotActive, boolValue(p.v.CDCSlotExists && p.v.CDCSlotActive))
			emit(h.cdcRetainedWAL, float64(p.v.CDCRetainedWALBytes))
		}
	}
	for _, name := range h.cfg.Consumers {
		emit(h.keyRetention, h.cfg.KeyRetention.Seconds(), name)
	}
	if t := s.topics; t != nil && up(t.ok, sourceTopics, "") {
		for topic, secs := range t.v {
			emit(h.topicRetention, secs, topic)
		}
	}
	for _, c := range s.consumers {
		if !up(c.ok, sourceConsumer, c.name) {
			continue
		}
		for _, l := range c.v.Letters {
			emit(h.letters, float64(l.Count), c.name, l.Topic, string(l.Reason))
			emit(h.letterAge, l.Oldest.Seconds(), c.name, l.Topic, string(l.Reason))
		}
		emit(h.parkedAggregates, float64(c.v.ParkedAggregates), c.name)
		emit(h.parkedRecords, float64(c.v.ParkedRecords), c.name)
		emit(h.parkedAge, c.v.OldestGap.Seconds(), c.name)
		emit(h.keys, float64(c.v.ProcessedKeys), c.name)
		emit(h.keyAge, c.v.OldestKey.Seconds(), c.name)
		emit(h.membersLive, float64(c.v.membersLive), c.name)
	}
	for _, g := range s.groups {
		if !up(g.ok, sourceGroupLag, g.name) {
			continue
		}
		for _, l := range g.v {
			emit(h.groupLag, float64(l.Lag), g.name, l.Topic, strconv.Itoa(int(l.Partition)))
		}
	}
}

// healthSample is what one sample read; it is not changed once taken.
type healthSample struct {
	// at is when the sample ended.
	at time.Time
	// producer is nil when SkipProducer is set.
	producer  *reading[producerState]
	consumers []reading[consumerState]
	// groups hold the partitions whose lag is known.
	groups []reading[[]kadm.GroupMemberLag]
	// topics holds the retention of Topics in seconds; nil without Topics.
	topics *reading[map[string]float64]
}

// producerState is the producer side's health and its live relays.
type producerState struct {
	producer.Health
	relaysLive int
}

// consumerState is a consumer's health and its live members.
type consumerState struct {
	consumer.Health
	membersLive int
}

// reading is one source's part of a sample: v when ok, nothing when its
// read failed.
type reading[T any] struct {
	name string
	v    T
	ok   bool
}

// sample returns the last sample, or a new one when that is older than
// Interval. Callers that arrive while a sample is taken wait for it.
func (h *HealthCollector) sample() *healthSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last != nil && time.Since(h.last.at) < h.cfg.Interval {
		return h.last
	}
	h.last = h.read()
	return h.last
}

// read takes a sample: every source at once, so that one that is slow (a
// lock on the events table, a broker far away) costs the others nothing,
// and all within one Timeout. Each goroutine writes its own part of the
// sample, and read waits for all of them.
func (h *HealthCollector) read() *healthSample {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Timeout)
	defer cancel()
	s := &healthSample{consumers: make([]reading[consumerState], len(h.cfg.Consumers))}
	var wg sync.WaitGroup
	if !h.cfg.SkipProducer {
		s.producer = &reading[producerState]{}
		wg.Go(func() {
			var v producerState
			var err error
			if v.Health, err = h.producer.Health(ctx); err == nil {
				var relays []producer.RelayInstance
				relays, err = h.producer.Relays(ctx)
				for _, r := range relays {
					if r.Live {
						v.relaysLive++
					}
				}
			}
			*s.producer = reading[producerState]{v: v, ok: h.ok(ctx, err, sourceProducer, "")}
		})
	}
	for i, name := range h.cfg.Consumers {
		wg.Go(func() {
			var v consumerState
			var err error
			if v.Health, err = h.consumers.Health(ctx, name); err == nil {
				var ms []consumer.Member
				ms, err = h.consumers.Members(ctx, name)
				for _, m := range ms {
					if m.Live {
						v.membersLive++
					}
				}
			}
			s.consumers[i] = reading[consumerState]{name: name, v: v, ok: h.ok(ctx, err, sourceConsumer, name)}
		})
	}
	if len(h.cfg.Groups) > 0 {
		wg.Go(func() { s.groups = h.readLag(ctx) })
	}
	if len(h.cfg.Topics) > 0 {
		s.topics = &reading[map[string]float64]{}
		wg.Go(func() {
			v, err := h.readRetention(ctx)
			*s.topics = reading[map[string]float64]{v: v, ok: h.ok(ctx, err, sourceTopics, "")}
		})
	}
	wg.Wait()
	s.at = time.Now()
	return s
}

// readLag reads the lag of every group in one request to the broker.
func (h *HealthCollector) readLag(ctx context.Context) []reading[[]kadm.GroupMemberLag] {
	lags, lagErr := h.cfg.Lag.Lag(ctx, h.cfg.Groups...)
	out := make([]reading[[]kadm.GroupMemberLag], len(h.cfg.Groups))
	for i, g := range h.cfg.Groups {
		out[i].name = g
		l, found := lags[g]
		err := lagErr
		switch {
		case err != nil:
		case !found:
			err = errors.New("the broker did not describe the group")
		case l.Error() != nil:
			err = l.Error()
		default:
			// A partition whose commit or end offset could not be read
			// has no lag to report (kadm sets Lag -1).
			for _, p := range l.Lag.Sorted() {
				if p.Err == nil {
					out[i].v = append(out[i].v, p)
				}
			}
		}
		out[i].ok = h.ok(ctx, err, sourceGroupLag, g)
	}
	return out
}

// readRetention reads the retention.ms of Topics, in seconds.
func (h *HealthCollector) readRetention(ctx context.Context) (map[string]float64, error) {
	configs, err := h.cfg.TopicConfigs.DescribeTopicConfigs(ctx, h.cfg.Topics...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64, len(configs))
	for _, rc := range configs {
		if rc.Err != nil {
			return nil, fmt.Errorf("describe topic %s: %w", rc.Name, rc.Err)
		}
		for _, c := range rc.Configs {
			if c.Key != "retention.ms" || c.Value == nil {
				continue
			}
			ms, err := strconv.ParseInt(*c.Value, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("topic %s: retention.ms %q: %w", rc.Name, *c.Value, err)
			}
			out[rc.Name] = -1
			if ms >= 0 {
				out[rc.Name] = float64(ms) / 1000
			}
		}
	}
	return out, nil
}

// ok logs err, when not nil, as the failed read of source and name.
func (h *HealthCollector) ok(ctx context.Context, err error, source, name string) bool {
	if err != nil {
		h.log.WarnContext(ctx, "outboxprom: read health, leaving its metrics out until the next sample",
			slog.String("source", source), slog.String("name", name), slog.String("error", err.Error()))
	}
	return err == nil
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
