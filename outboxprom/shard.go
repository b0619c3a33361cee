package outboxprom

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// ForShard returns a registerer that registers on reg and gives every
// series of what is registered through it the label shard=name: give
// NewRelayMetrics, NewConsumerMetrics and the HealthCollector's Register
// one per shard, and one registry serves the metrics of a whole fleet,
// each series labelled with its shard (LabelShard). name is the shard's
// name, shard.Shard.Name, and must be non-empty: a series without the
// label is the one of a process that runs on one database.
//
// Registering the same collectors once through reg and once through a
// ForShard of it fails as a duplicate registration would: either label
// every shard or none.
func ForShard(reg prometheus.Registerer, name string) (prometheus.Registerer, error) {
	if reg == nil {
		return nil, errors.New("outboxprom: ForShard needs a prometheus.Registerer; got nil (prometheus.DefaultRegisterer is the global one)")
	}
	if name == "" || !utf8.ValidString(name) {
		return nil, fmt.Errorf("outboxprom: ForShard: shard name %q is not a label value: give the shard's name (shard.Shard.Name)", name)
	}
	return prometheus.WrapRegistererWith(prometheus.Labels{LabelShard: name}, reg), nil
}
