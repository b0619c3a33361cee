package deadletter

import "errors"

// ErrResolved is returned by consumer.Processor's Replay and Discard for a
// letter that was replayed or discarded already, and by package producer's
// DeadEvents for a dead event that was.
var ErrResolved = errors.New("deadletter: already replayed or discarded")
