package consumer

// RetentionKind is a way a record can come back after its processed key
// was pruned, when the consumer would apply its effect a second time: the
// kind of a RetentionWarning.
type RetentionKind string

const (
	// RetentionReplayWindow is [Config.KeyRetention] shorter than
	// [Config.ReplayWindow]: a dead letter replayed after its key was pruned
	// applies its effect again. Raise KeyRetention to at least
	// ReplayWindow.
	RetentionReplayWindow RetentionKind = "replay_window"
	// RetentionTopicLonger is a topic that keeps its records (retention.ms)
	// longer than [Config.KeyRetention]: a redelivery after the key was
	// pruned (an offset reset, a new consumer group) applies its effect
	// again. Raise KeyRetention above the topic's retention.ms, or lower
	// retention.ms.
	RetentionTopicLonger RetentionKind = "topic_longer"
	// RetentionTopicForever is a topic that keeps its records forever
	// (retention.ms -1): a reset to an old offset applies effects again.
	// Give the topic a retention.ms, or accept the risk.
	RetentionTopicForever RetentionKind = "topic_forever"
	// RetentionTopicCompacted is a compacted topic (cleanup.policy=compact,
	// without delete): it keeps each key's latest record for as long as
	// the topic exists, whatever retention.ms says, so a reset to an old
	// offset or a new consumer group applies those records' effects again.
	// Use cleanup.policy=compact,delete with a retention.ms below
	// KeyRetention, or accept the risk.
	RetentionTopicCompacted RetentionKind = "topic_compacted"
)

// RetentionWarning is one way CheckRetention found for a record to be
// applied twice.
type RetentionWarning struct {
	Kind RetentionKind
	// Topic is the topic the warning is about; empty for
	// RetentionReplayWindow.
	Topic string
	// Message says it in a sentence, with the durations: what Run logs.
	Message string
}
