package deadletter

import "errors"

var (
	// ErrNotFound is returned for an id that has no dead letter.
	ErrNotFound = errors.New("deadletter: not found")
	// ErrResolved is returned by Replay and Discard for a letter that was
	// replayed or discarded already.
	ErrResolved = errors.New("deadletter: already replayed or discarded")
)
