package producer

import "time"

// RelayInstance is one relay instance as the database sees it, as
// [Inspector.Relays] lists it: its row in the relays table and the bucket
// locks its session holds. [Relay.Health] is the running relay's own account.
type RelayInstance struct {
	// RelayID names the instance ([RelayConfig.RelayID]).
	RelayID string
	// HeartbeatAt is when it last renewed its row.
	HeartbeatAt time.Time
	// Live reports whether the session holding its bucket locks still
	// exists. A row without a session (a relay from before migration 0006,
	// or one between sessions) is not live.
	Live bool
	// Idle reports whether it last said it had nothing to do.
	Idle bool
	// Buckets are the buckets (0 to 63) whose locks its session holds,
	// ascending.
	Buckets []int32
}

// maxRelays bounds [Inspector.Relays]; 64 buckets make more than 64 working
// instances impossible.
const maxRelays = 1000
