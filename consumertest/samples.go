package consumertest

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/ordering"
)

// sample is what Run reads of a sample record: its idempotency key, its
// aggregate and its sequence (0 when it has none).
type sample struct {
	key string
	agg ordering.Aggregate
	seq int64
}

// readSamples reads recs as the consumer will, and refuses samples that
// cannot pass whatever the handler does, naming the record and the fix:
// a record without an idempotency key, two records with one key (the
// consumer applies only the first), a sequence that is not a number from
// 1 or has no aggregate, and an aggregate's sequences out of order or with
// a hole. keyFunc is consumer.Config.KeyFunc, or nil.
func readSamples(recs []*kgo.Record, keyFunc func(*kgo.Record) (string, error)) ([]sample, error) {
	out := make([]sample, len(recs))
	byKey := map[string]int{}
	last := map[ordering.Aggregate]int{}
	for i, r := range recs {
		if r == nil {
			return nil, fmt.Errorf("consumertest: Records[%d] is nil", i)
		}
		s, err := readSample(r, keyFunc)
		if err != nil {
			return nil, fmt.Errorf("consumertest: Records[%d]: %w", i, err)
		}
		if j, dup := byKey[s.key]; dup {
			return nil, fmt.Errorf("consumertest: Records[%d] and Records[%d] share the idempotency key %q, so the consumer would apply only the first of them; give each event its own id (consumertest.Records does), Check delivers duplicates itself", j, i, s.key)
		}
		byKey[s.key] = i
		if s.seq > 0 {
			if j, seen := last[s.agg]; seen && s.seq != out[j].seq+1 {
				return nil, fmt.Errorf("consumertest: Records[%d] is %s seq %d, after Records[%d] at seq %d: give each aggregate's records in sequence order without a hole (the first may be above 1; consumertest.Records numbers them so)", i, s.agg, s.seq, j, out[j].seq)
			}
			last[s.agg] = i
		}
		out[i] = s
	}
	return out, nil
}

func readSample(r *kgo.Record, keyFunc func(*kgo.Record) (string, error)) (sample, error) {
	var s sample
	get := func(name string) (string, bool) {
		for _, h := range r.Headers {
			if h.Key == name {
				return string(h.Value), true
			}
		}
		return "", false
	}
	for _, name := range []string{outbox.HeaderIdempotencyKey, outbox.HeaderEventID, outbox.HeaderDebeziumID} {
		if v, _ := get(name); v != "" {
			s.key = v
			break
		}
	}
	if s.key == "" && keyFunc != nil {
		k, err := keyFunc(r)
		if err != nil {
			return s, fmt.Errorf("Config.Consumer.KeyFunc: %w", err)
		}
		s.key = k
	}
	if s.key == "" {
		return s, fmt.Errorf("no idempotency key: none of the headers %s, %s and %s is set, and no Config.Consumer.KeyFunc gives one; build the record with consumertest.Records or producer.Record, which set them",
			outbox.HeaderIdempotencyKey, outbox.HeaderEventID, outbox.HeaderDebeziumID)
	}
	s.agg.Type, _ = get(outbox.HeaderAggregateType)
	id, ok := get(outbox.HeaderAggregateID)
	if !ok {
		id = string(r.Key)
	}
	s.agg.ID = id
	v, ok := get(outbox.HeaderAggregateSeq)
	if !ok {
		return s, nil
	}
	seq, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	switch {
	case err != nil || seq < 1:
		return s, fmt.Errorf("header %s is %q, but sequences are decimal numbers from 1; number each aggregate's records 1, 2, 3 (consumertest.Records does), or drop the header for a record outside ordering", outbox.HeaderAggregateSeq, v)
	case s.agg.ID == "":
		return s, fmt.Errorf("header %s is %q, but the record has no aggregate id; set the %s header or the record key", outbox.HeaderAggregateSeq, v, outbox.HeaderAggregateID)
	}
	s.seq = seq
	return s, nil
}
