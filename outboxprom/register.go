package outboxprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// register registers cs on reg, all or none: after a failure it
// unregisters the ones it registered, so that the caller may try again.
func register(reg prometheus.Registerer, who string, cs ...prometheus.Collector) error {
	if reg == nil {
		return errors.New("outboxprom: " + who + " needs a prometheus.Registerer; got nil (prometheus.DefaultRegisterer is the global one)")
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return fmt.Errorf("outboxprom: %s: register metrics: %w", who, err)
		}
	}
	return nil
}
