package dedupe

import (
	"errors"
)

// ErrEmptyKey is returned when a claim is asked for an empty key: an empty
// key would make every keyless message a duplicate of the first.
var ErrEmptyKey = errors.New("dedupe: empty key")
