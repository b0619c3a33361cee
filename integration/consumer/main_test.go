// Package consumer_test runs the consumer side end to end: events written
// with producer.Write, published by producer.Relay, consumed by
// consumer.Consumer, against kfake or the real brokers in KAFKA_BROKERS
// (CI runs it against a real Apache Kafka broker).
package consumer_test

import (
	"testing"

	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
