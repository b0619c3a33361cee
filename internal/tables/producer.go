package tables

// Producer holds the statements of the producer's tables in one schema:
// events, sequences, dead_events, relays, dispatch and, for the relay's
// counts, activity.
type Producer struct {
	Writer     Writer
	Relay      Relay
	DeadEvents DeadEvents
	Dispatch   Dispatch
	Retention  Retention
	Health     OutboxHealth
}

// ProducerFor returns the producer's statements with schema written in,
// quoted.
func ProducerFor(schema string) *Producer {
	q := func(sql string) string { return Fill(sql, schema) }
	return &Producer{
		Writer:     writer(schema),
		Relay:      relay(q, schema),
		DeadEvents: deadEvents(q),
		Dispatch:   dispatch(q),
		Retention:  retention(q, schema),
		Health:     outboxHealth(q),
	}
}
