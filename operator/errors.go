package operator

import "errors"

var (
	// ErrNotFound is returned for an id that has no request.
	ErrNotFound = errors.New("operator: request not found")
	// ErrInvalid is wrapped by Submit's error for a request that names no
	// consumer, no known action, or no letters or aggregate to act on.
	ErrInvalid = errors.New("operator: invalid request")
)
