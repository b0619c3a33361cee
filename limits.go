package outbox

// Length limits, in bytes, on the contract fields that end up in a btree
// index on either side (the writer's sequences, the consumer's processed
// keys, positions, parked records and open dead letters). PostgreSQL
// refuses an index entry above about 2,700 bytes (SQLSTATE 54000), and a
// value the consumer cannot index is a record it can never apply: the
// producer refuses such events in Write, and the consumer dead-letters
// records that carry them. Together the limits keep every composite key
// well inside one index entry.
const (
	// MaxAggregateTypeBytes bounds an aggregate type.
	MaxAggregateTypeBytes = 255
	// MaxAggregateIDBytes bounds an aggregate id.
	MaxAggregateIDBytes = 1024
	// MaxIdempotencyKeyBytes bounds an idempotency key.
	MaxIdempotencyKeyBytes = 1024
	// MaxConsumerNameBytes bounds a consumer name.
	MaxConsumerNameBytes = 255
)
