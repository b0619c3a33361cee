package outboxotel

import "go.opentelemetry.io/otel/attribute"

// The names this package gives spans, attributes and instruments, all in
// one place. They follow the OpenTelemetry semantic conventions for
// messaging on Kafka; the outbox.* ones are this SDK's own.
const (
	// scope names the tracer and meter.
	scope = "github.com/d419a114/outbox/outboxotel"

	opSend    = "send"
	opProcess = "process"
	opClaim   = "claim"

	keySystem             = attribute.Key("messaging.system")
	keyOperationName      = attribute.Key("messaging.operation.name")
	keyOperationType      = attribute.Key("messaging.operation.type")
	keyDestination        = attribute.Key("messaging.destination.name")
	keyPartition          = attribute.Key("messaging.destination.partition.id")
	keyOffset             = attribute.Key("messaging.kafka.offset")
	keyMessageKey         = attribute.Key("messaging.kafka.message.key")
	keyMessageID          = attribute.Key("messaging.message.id")
	keyConsumerGroup      = attribute.Key("messaging.consumer.group.name")
	keyBatchCount         = attribute.Key("messaging.batch.message_count")
	keyErrorType          = attribute.Key("error.type")
	keyOutcome            = attribute.Key("outbox.consumer.outcome")
	keyDeadLetterID       = attribute.Key("outbox.consumer.dead_letter_id")
	keyPublishedDelivered = attribute.Key("outbox.relay.delivered")
	keyPublishedFailed    = attribute.Key("outbox.relay.failed")
	keyPublishedDead      = attribute.Key("outbox.relay.dead")
	keyClaimed            = attribute.Key("outbox.relay.claimed")

	systemKafka = "kafka"

	// Instruments.
	metricProcessDuration   = "messaging.process.duration"
	metricConsumedMessages  = "messaging.client.consumed.messages"
	metricOperationDuration = "messaging.client.operation.duration"
	metricSentMessages      = "messaging.client.sent.messages"
)
