// Package consumer_test runs the consumer side end to end: events written
// with producer.Write, published by producer.Relay, consumed by
// consumer.Consumer, against kfake or the real brokers in KAFKA_BROKERS
// (CI runs it against a real Apache Kafka broker).
package consumer_test

import (
	"fmt"
	"testing"

	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// run is one way of running a test's consumer: its batch size and
// Config.Concurrency.
type run struct {
	name               string
	batch, concurrency int
}

// runs returns each of batches at Concurrency 1 and 16.
func runs(batches []int) []run {
	var out []run
	for _, c := range []int{1, 16} {
		for _, b := range batches {
			out = append(out, run{fmt.Sprintf("batch=%d/concurrency=%d", b, c), b, c})
		}
	}
	return out
}
