package producer

// ClaimSQL is the relay's claim statement for schema, for the tests and
// benchmarks that run it on their own. Its parameters: the buckets
// (int[]), the batch size, the lease in milliseconds and the bucket hashes
// of the aggregates in flight (int[]).
func ClaimSQL(schema string) string { return newRelaySQL(schema).claim }
