package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/tables"
	"github.com/d419a114/outbox/producer"
)

// maxConsumers bounds the consumers the overview shows.
const maxConsumers = 200

// overviewData is the overview page's data.
type overviewData struct {
	// Producer is the producer's health; ProducerErr says why it could not
	// be read (no producer tables in this database, say).
	Producer    producer.Health
	ProducerErr string
	Relays      []producer.RelayInstance
	// NoRelay is set when events wait and no relay instance is live.
	NoRelay bool
	// Delivered is the relays' delivered events per minute.
	Delivered chart
	// Members are the consumers' members, live and lately gone.
	Members []consumer.Member
	// LagShown says the consumers' lag is read ([Config.Kafka]).
	LagShown  bool
	Consumers []consumerSummary
	// MoreConsumers counts the consumers left out past maxConsumers.
	MoreConsumers int
	KeyRetention  time.Duration
	// SampledAt is when the consumers' rows were read; HealthEvery how
	// often they are.
	SampledAt   time.Time
	HealthEvery time.Duration
}

// consumerSample is the consumers' rows of the overview as last read, for
// [Config.HealthEvery].
type consumerSample struct {
	mu   sync.Mutex
	at   time.Time
	rows []consumerSummary
	more int
}

// consumerSummary is one consumer's row of the overview.
type consumerSummary struct {
	Name string
	// OpenLetters, Gaps and ParkedRecords are counted up to
	// [Config.CountCap] ("10000+" past it); ParkedRecords counts the
	// records of the gaps counted.
	OpenLetters, Gaps, ParkedRecords string
	// Letters says it has open letters.
	Letters                 bool
	OldestGap, OldestLetter time.Duration
	// Warnings are the dedupe horizon warnings.
	Warnings []string
	// Applied is its records applied per minute.
	Applied chart
	// Lag is its group's lag from the broker ([Config.Kafka]); LagErr why
	// it could not be read; Lags its partitions, most behind first.
	Lag    int64
	LagErr string
	Lags   []partitionLag
	// Live counts its live members (set on every view).
	Live int
}

// partitionLag is one partition's lag.
type partitionLag struct {
	Topic     string
	Partition int32
	Lag       int64
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	data := overviewData{KeyRetention: d.cfg.KeyRetention, LagShown: d.cfg.Kafka != nil}
	var err error
	if data.Producer, err = d.prod.Health(ctx); err != nil {
		data.ProducerErr = d.logged(r, err)
	} else if data.Relays, err = d.prod.Relays(ctx); err != nil {
		data.ProducerErr = d.logged(r, err)
	} else if data.Delivered, err = d.readChart(ctx, "delivered", ""); err != nil {
		data.ProducerErr = d.logged(r, err)
	}
	if data.ProducerErr == "" && data.Producer.Undelivered > 0 && data.Producer.Dispatch != producer.DispatchCDC {
		data.NoRelay = !slices.ContainsFunc(data.Relays, func(i producer.RelayInstance) bool { return i.Live })
	}
	if data.Members, err = d.cons.Members(ctx, ""); err != nil {
		d.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	s := &d.sample
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at.IsZero() || time.Since(s.at) >= d.cfg.HealthEvery {
		if err := d.readConsumers(r); err != nil {
			d.fail(w, r, http.StatusInternalServerError, err)
			return
		}
	}
	data.Consumers, data.MoreConsumers, data.SampledAt, data.HealthEvery = slices.Clone(s.rows), s.more, s.at, d.cfg.HealthEvery
	for i := range data.Consumers {
		for _, m := range data.Members {
			if m.Live && m.Consumer == data.Consumers[i].Name {
				data.Consumers[i].Live++
			}
		}
	}
	d.render(w, r, "overview", "Overview", &data)
}

// readConsumers reads the consumers' rows into d.sample, under its mu:
// one view reads them while the others wait for its result.
func (d *Dashboard) readConsumers(r *http.Request) error {
	names, err := d.cons.Consumers(r.Context())
	if err != nil {
		return err
	}
	more := 0
	if len(names) > maxConsumers {
		more = len(names) - maxConsumers
		names = names[:maxConsumers]
	}
	rows := make([]consumerSummary, 0, len(names))
	for _, n := range names {
		s, err := d.summarize(r, n)
		if err != nil {
			return err
		}
		rows = append(rows, s)
	}
	d.sample.rows, d.sample.more, d.sample.at = rows, more, time.Now()
	return nil
}

// summarize reads consumer name's row of the overview.
func (d *Dashboard) summarize(r *http.Request, name string) (consumerSummary, error) {
	ctx := r.Context()
	var (
		letters, gaps, parked int64
		oldestLetter, oldGap  float64
	)
	err := d.pool.QueryRow(ctx, tables.For(d.cfg.Schema).Reads.Summary, name, d.cfg.CountCap+1).Scan(&letters, &oldestLetter, &gaps, &parked, &oldGap)
	if err != nil {
		return consumerSummary{}, fmt.Errorf("dashboard: read consumer %s: %w", name, err)
	}
	s := consumerSummary{Name: name, OpenLetters: capped(letters, d.cfg.CountCap), Letters: letters > 0, Gaps: capped(gaps, d.cfg.CountCap),
		ParkedRecords: capped(parked, d.cfg.CountCap), OldestLetter: seconds(oldestLetter), OldestGap: seconds(oldGap)}
	if gaps > int64(d.cfg.CountCap) {
		s.ParkedRecords = "at least " + strconv.FormatInt(parked, 10)
	}
	if s.Applied, err = d.readChart(ctx, "applied", name); err != nil {
		return consumerSummary{}, err
	}
	if d.cfg.Kafka != nil {
		d.readLag(ctx, &s)
	}
	s.Warnings = horizonWarnings(s, d.cfg.KeyRetention)
	return s, nil
}

// seconds is a count of seconds as a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// horizonWarnings says where s's records may come back after their keys
// were pruned. (Whether keys are kept past the retention needs the oldest
// key, which only a scan finds: outbox consumers and outboxprom report
// it.)
func horizonWarnings(s consumerSummary, keep time.Duration) []string {
	var ws []string
	if s.OldestLetter > keep {
		ws = append(ws, "open dead letters are older ("+age(s.OldestLetter)+") than the key retention ("+age(keep)+
			"): a replay may apply an effect whose key was pruned a second time")
	}
	if s.OldestGap > keep {
		ws = append(ws, "parked records are older ("+age(s.OldestGap)+") than the key retention ("+age(keep)+
			"): draining them may apply effects a second time")
	}
	return ws
}

// readLag reads s's group lag from the broker: the group its members
// last reported. A lag that cannot be read is shown as why.
func (d *Dashboard) readLag(ctx context.Context, s *consumerSummary) {
	ms, err := d.cons.Members(ctx, s.Name)
	if err != nil || len(ms) == 0 || ms[0].Group == "" {
		s.LagErr = "no member has reported its group"
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lags, err := kadm.NewClient(d.cfg.Kafka).Lag(ctx, ms[0].Group)
	if err == nil {
		err = lags.Error()
	}
	if err != nil {
		s.LagErr = "lag of group " + ms[0].Group + ": " + err.Error()
		return
	}
	for _, g := range lags.Sorted() {
		s.Lag += g.Lag.Total()
		for _, p := range g.Lag.Sorted() {
			s.Lags = append(s.Lags, partitionLag{Topic: p.Topic, Partition: p.Partition, Lag: p.Lag})
		}
	}
	slices.SortFunc(s.Lags, func(a, b partitionLag) int { return int(min(max(b.Lag-a.Lag, -1), 1)) })
	if len(s.Lags) > maxLagRows {
		s.Lags = s.Lags[:maxLagRows]
	}
}

// maxLagRows bounds the partitions the overview lists per consumer.
const maxLagRows = 20
