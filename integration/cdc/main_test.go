// Package cdc_test runs change data capture end to end: events written with
// producer.Write (WriterConfig.CDC) into a schema in CDC mode
// (producer.SetDispatch), published by a real Debezium PostgreSQL connector
// with its outbox event router in a real Kafka Connect worker
// (integration/connect/connect.sh), to a real Apache Kafka broker
// (integration/kafka/broker.sh), and applied by consumer.Consumer. The
// throwaway PostgreSQL cluster runs with wal_level=logical.
//
// The tests need KAFKA_BROKERS and CONNECT_URL (and CONNECT_SCRIPT, the
// path of connect.sh, for the tests that kill and restart the worker).
// Without KAFKA_BROKERS they skip, unless INTEGRATION_REQUIRE_KAFKA is set:
// then every missing piece fails the test, as in CI.
package cdc_test

import (
	"testing"

	"github.com/d419a114/outbox/internal/pgserver"
	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainConfig(m, pgserver.Config{LogicalReplication: true}) }
