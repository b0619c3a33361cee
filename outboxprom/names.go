package outboxprom

// The name of every metric the package exports, in one place so that
// dashboards and alert rules can be checked against it. README.md says
// what each one means and which to alert on.
const (
	// RelayEvents counts a relay's published events, labelled outcome:
	// delivered, failed (an attempt the broker did not acknowledge) and
	// dead (failed for the last time; each dead one is also counted as
	// failed).
	RelayEvents = "outbox_relay_events_total"
	// RelayPublishLag is a histogram, labelled topic, of the time from an
	// event's outbox-occurred-at header to the end of the relay's batch
	// that delivered it.
	RelayPublishLag = "outbox_relay_publish_lag_seconds"
	// RelayClaimEvents is a histogram of how many events a claim took, over
	// the claims that took any.
	RelayClaimEvents = "outbox_relay_claim_events"
	// RelayClaimDuration is a histogram of how long claims took, empty ones
	// included.
	RelayClaimDuration = "outbox_relay_claim_duration_seconds"
	// RelayErrors counts a relay's failed operations, labelled operation:
	// claim, record (a batch's outcome could not be written back; its
	// events are published again after their lease) and prune.
	RelayErrors = "outbox_relay_errors_total"
	// RelayListenerUp is 1 while the relay's LISTEN session is up and 0
	// once it went down.
	RelayListenerUp = "outbox_relay_listener_up"
	// RelayBucketsOwned is how many of the 64 buckets the relay owned after
	// its last rebalance.
	RelayBucketsOwned = "outbox_relay_buckets_owned"
	// RelayPrunedRows counts delivered events pruned from a plain events
	// table.
	RelayPrunedRows = "outbox_relay_pruned_rows_total"
	// RelayPrunedPartitions counts day partitions dropped from a
	// partitioned events table.
	RelayPrunedPartitions = "outbox_relay_pruned_partitions_total"

	// ConsumerRecords counts the records a consumer was done with or handed
	// back, labelled consumer, topic and outcome.
	ConsumerRecords = "outbox_consumer_records_total"
	// ConsumerProcessDuration is a histogram, labelled consumer and topic,
	// of the time from a record's start to its end, whatever its outcome.
	ConsumerProcessDuration = "outbox_consumer_process_duration_seconds"
	// ConsumerApplyLag is a histogram, labelled consumer and topic, of the
	// time from an applied record's outbox-occurred-at header (or, without
	// one, its Kafka timestamp) to the end of its processing.
	ConsumerApplyLag = "outbox_consumer_apply_lag_seconds"

	// EventsUndelivered is how many events the broker has not acknowledged.
	EventsUndelivered = "outbox_events_undelivered"
	// EventsUndeliveredOldestAge is the age of the oldest undelivered
	// event; 0 when there is none.
	EventsUndeliveredOldestAge = "outbox_events_undelivered_oldest_age_seconds"
	// EventsDead is how many events exhausted their attempts and wait for a
	// replay or discard.
	EventsDead = "outbox_events_dead"
	// RelaysLive is how many relay instances of the schema are alive (their
	// lock session exists and their heartbeat is recent).
	RelaysLive = "outbox_relays_live"
	// ConsumerMembersLive is how many processes run a Consumer of the
	// consumer (consumer.Inspector.Members with a recent beat), labelled consumer.
	ConsumerMembersLive = "outbox_consumer_members_live"
	// CDCSlotActive is 1 while a connector reads the replication slot of a
	// schema dispatched by change data capture (producer.SetDispatch), 0
	// when none does or the slot is gone. Reported only in CDC mode.
	CDCSlotActive = "outbox_cdc_slot_active"
	// CDCRetainedWAL is how many bytes of WAL that slot keeps from being
	// removed; it grows while no connector reads the slot. Reported only in
	// CDC mode.
	CDCRetainedWAL = "outbox_cdc_retained_wal_bytes"
	// ConsumerDeadLetters is how many dead letters are open, labelled
	// consumer, topic and reason.
	ConsumerDeadLetters = "outbox_consumer_dead_letters"
	// ConsumerDeadLetterOldestAge is how long the oldest open dead letter
	// of each consumer, topic and reason has been open.
	ConsumerDeadLetterOldestAge = "outbox_consumer_dead_letter_oldest_age_seconds"
	// ConsumerParkedAggregates is how many aggregates have records parked
	// behind a gap or a dead letter, labelled consumer.
	ConsumerParkedAggregates = "outbox_consumer_parked_aggregates"
	// ConsumerParkedRecords is how many records are parked, labelled
	// consumer.
	ConsumerParkedRecords = "outbox_consumer_parked_records"
	// ConsumerParkedOldestAge is how long the oldest parked record has
	// waited, labelled consumer; 0 when none is parked.
	ConsumerParkedOldestAge = "outbox_consumer_parked_oldest_age_seconds"
	// ConsumerProcessedKeys is how many processed keys are kept for dedupe,
	// labelled consumer.
	ConsumerProcessedKeys = "outbox_consumer_processed_keys"
	// ConsumerProcessedKeyOldestAge is the age of the oldest processed key,
	// labelled consumer: how far back dedupe reaches. 0 when there is none.
	ConsumerProcessedKeyOldestAge = "outbox_consumer_processed_key_oldest_age_seconds"
	// ConsumerGroupLag is how many records a consumer group is behind the
	// end of a partition, labelled group, topic and partition.
	ConsumerGroupLag = "outbox_consumer_group_lag"
	// ConsumerKeyRetention is how long a consumer keeps processed keys,
	// labelled consumer, as HealthConfig.KeyRetention says.
	ConsumerKeyRetention = "outbox_consumer_key_retention_seconds"
	// TopicRetention is a topic's retention.ms in seconds, labelled topic;
	// -1 when the topic keeps records forever.
	TopicRetention = "outbox_topic_retention_seconds"
	// HealthUp is 1 when the last sample of what its labels source and name
	// say was read, 0 when reading it failed; that source's other metrics
	// are left out until a read succeeds.
	HealthUp = "outbox_health_up"
)

// Label names. Every label's values are bounded: topics, partitions,
// consumer and group names come from configuration, the rest from fixed
// sets. No label carries a key, an aggregate or an event id.
const (
	// LabelOutcome is what became of an event or a record: delivered,
	// failed or dead for RelayEvents; applied, duplicate, parked,
	// dead_lettered or not_done for ConsumerRecords.
	LabelOutcome = "outcome"
	// LabelOperation is the relay's operation that failed: claim, record
	// or prune.
	LabelOperation = "operation"
	// LabelTopic is a Kafka topic.
	LabelTopic = "topic"
	// LabelPartition is a Kafka partition, in decimal.
	LabelPartition = "partition"
	// LabelShard is the name of the shard (shard.Shard.Name) a series
	// is about, on every series registered through ForShard.
	LabelShard = "shard"
	// LabelConsumer is a consumer's name, as given to consumer.New or
	// consumer.Handle.
	LabelConsumer = "consumer"
	// LabelGroup is a Kafka consumer group.
	LabelGroup = "group"
	// LabelReason is a dead letter's class (consumer.LetterCount.Reason),
	// one of deadletter.Reasons.
	LabelReason = "reason"
	// LabelSource is what a HealthUp series is about: producer, consumer,
	// group_lag or topic_retention.
	LabelSource = "source"
	// LabelName is the consumer or group a HealthUp series is about; empty
	// for the producer.
	LabelName = "name"
)

// Label values other than the core's own Outcome.String.
const (
	outcomeDelivered = "delivered"
	outcomeFailed    = "failed"
	outcomeDead      = "dead"
	// outcomeNotDone is a record handed back with an error.
	outcomeNotDone = "not_done"

	operationClaim  = "claim"
	operationRecord = "record"
	operationPrune  = "prune"

	sourceProducer = "producer"
	sourceConsumer = "consumer"
	sourceGroupLag = "group_lag"
	sourceTopics   = "topic_retention"
)
