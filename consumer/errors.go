package consumer

import (
	"errors"
	"fmt"
)

// ErrClosed is returned by Run when called twice or after the client was
// closed.
var ErrClosed = errors.New("consumer: closed")

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as not worth retrying: the record goes to the
// dead-letter table at once. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// PanicError is a handler panic, recovered. It is retried like an error;
// its stack goes into the dead letter.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("consumer: handler panicked: %v", e.Value) }

// infraError is a failure of the consumer's own database work (begin,
// dedupe, ordering, commit bookkeeping), as opposed to the handler's. It is
// never dead-lettered: the record is returned to the caller to try later.
type infraError struct{ err error }

func (e *infraError) Error() string { return e.err.Error() }
func (e *infraError) Unwrap() error { return e.err }

func infra(err error) error {
	if err == nil {
		return nil
	}
	return &infraError{err: err}
}
