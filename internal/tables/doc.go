// Package tables is the one home of the SQL on the consumer's tables:
// processed_keys, positions, parked and dead_letters, one file per table,
// and the consumer's hot-path statements that touch two of them at once,
// beside the others. Every statement names its tables as {schema}.name;
// Fill writes the schema in, here and for the producer's and Migrate's
// statements, and nothing else builds SQL text.
//
// The stores in dedupe, ordering and deadletter and the consumer's
// Processor run these statements; what each one means is documented where
// it is defined.
package tables
