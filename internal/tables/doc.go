// Package tables is the one home of the SDK's SQL: every statement either
// half runs, each a named and documented field of a group filled for one
// schema.
//
//   - For returns the consumer's (Consumer): processed_keys, positions,
//     parked, dead_letters, consumer_members and activity, one file per
//     table, the hot path's statements that touch two of them at once, and
//     Reads, what health checks, exporters and the dashboard read.
//   - ProducerFor returns the producer's (Producer): the Writer's on events
//     and sequences, the Relay's, DeadEvents, Dispatch, Retention and
//     Health.
//   - OperatorFor returns the operator's (Operator): operator_requests and
//     operator_audit.
//
// Every statement names its tables as {schema}.name; Fill writes the
// schema in, quoted, here and for Migrate's statements. A statement built
// from parts (a filter, a wake-up check, the plain or partitioned events
// layout) is built here, once per schema, into fixed statements. The tests
// walk every group by reflection: no placeholder survives, and PostgreSQL
// prepares every statement against both layouts of a migrated schema. A
// further test fails when a Go file outside this package (and a short,
// justified allow-list) writes SQL text.
package tables
