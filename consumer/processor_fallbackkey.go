package consumer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/d419a114/outbox"
)

// fallbackKeyWarnEvery is how often, per topic, the Processor warns about
// duplicates whose key came from Debezium's id header.
const fallbackKeyWarnEvery = 10 * time.Minute

// fallbackKeyWarner rate-limits that warning. Its zero value is ready.
//
// A key taken from the id header is only as unique as the producer made
// it. Debezium's outbox event router fills id from the outbox table's id
// column; a table whose id is, say, the aggregate's id or a per-tenant
// counter gives many events one key, and every event after the first is
// skipped as a duplicate. A duplicate cannot be told apart from a
// redelivery (which has another offset too), so the Processor cannot
// refuse it; it says so, at WARN, the first time per topic and then at
// most every fallbackKeyWarnEvery, with the count in between.
type fallbackKeyWarner struct {
	mu sync.Mutex
	// topics holds, per topic, when the last warning went out and how many
	// duplicates came since.
	topics map[string]*fallbackKeyTopic
}

type fallbackKeyTopic struct {
	warned  time.Time
	skipped int64
}

// noteDuplicates calls noteDuplicate for each message whose result is a
// Duplicate.
func (p *Processor) noteDuplicates(ctx context.Context, msgs []*Message, res []Result) {
	for i, m := range msgs {
		if i < len(res) && res[i].Outcome == Duplicate {
			p.noteDuplicate(ctx, m)
		}
	}
}

// noteDuplicate is told of m skipped as a duplicate of a claimed key, and
// warns (rate-limited) when that key came from Debezium's id header.
func (p *Processor) noteDuplicate(ctx context.Context, m *Message) {
	if m.keyFrom != outbox.HeaderDebeziumID {
		return
	}
	w := &p.fallbackKeys
	w.mu.Lock()
	if w.topics == nil {
		w.topics = map[string]*fallbackKeyTopic{}
	}
	t := w.topics[m.Topic]
	if t == nil {
		t = &fallbackKeyTopic{}
		w.topics[m.Topic] = t
	}
	now := time.Now()
	if !t.warned.IsZero() && now.Sub(t.warned) < fallbackKeyWarnEvery {
		t.skipped++
		w.mu.Unlock()
		return
	}
	skipped := t.skipped
	t.warned, t.skipped = now, 0
	w.mu.Unlock()
	p.log.WarnContext(ctx, "consumer: record skipped as a duplicate of a key taken from the "+outbox.HeaderDebeziumID+
		" header (Debezium's key fallback); a redelivery is fine, but if that header is not unique per event, later events are being dropped: set the "+
		outbox.HeaderIdempotencyKey+" header or Config.KeyFunc; this warning repeats at most every "+fallbackKeyWarnEvery.String()+" per topic",
		slog.String("topic", m.Topic), slog.Int("partition", int(m.Partition)), slog.Int64("offset", m.Offset),
		slog.String("key", m.IdempotencyKey), slog.Int64("duplicates_since_last_warning", skipped))
}
