package outbox

import "errors"

// ErrNotFound is wrapped by the error of every lookup or action whose id
// names nothing: a dead letter (package deadletter), a dead event (package
// producer), an operator request (package operator). Test for it with
// errors.Is(err, outbox.ErrNotFound); the error's message names what was
// not found, as in "deadletter: letter 42: outbox: not found".
var ErrNotFound = errors.New("outbox: not found")
