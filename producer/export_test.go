package producer

import "github.com/d419a114/outbox/internal/tables"

// ClaimSQL is the relay's claim statement for schema, for the tests and
// benchmarks that run it on their own. Its parameters: the buckets
// (int[]), the batch size, the lease in milliseconds and the bucket hashes
// of the aggregates in flight (int[]).
func ClaimSQL(schema string) string { return tables.ProducerFor(schema).Relay.Claim }

// ClaimSessionSQL sets up a session for ClaimSQL as the relay sets up its
// lock session.
func ClaimSessionSQL(schema string) string { return tables.ProducerFor(schema).Relay.ClaimSession }

// BucketLockKey is the first key of the relay's bucket locks on schema
// (pg_advisory_lock(key, bucket)), for the tests that hold buckets
// themselves.
func BucketLockKey(schema string) int32 { return schemaLockKey(schema) }

// NumBuckets is how many buckets the relays of a schema share.
const NumBuckets = numBuckets
