package main

import "errors"

// Exit codes: what failed, for scripts.
const (
	exitOK = 0
	// exitError: the command could not run (the database, a query).
	exitError = 1
	// exitUsage: the command line is wrong.
	exitUsage = 2
	// exitNotFound: the letter, event, request or gap named does not
	// exist.
	exitNotFound = 3
	// exitFailed: the action was carried out and failed (for a bulk
	// request: at least one letter failed).
	exitFailed = 4
	// exitPending: -wait ran out before the consumer finished the
	// request; it goes on.
	exitPending = 5
)

// codedError is an error with the exit code it ends the command with.
type codedError struct {
	code int
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

// withCode ends the command with code when err is not nil.
func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &codedError{code: code, err: err}
}

// exitCode is the code err ends the command with.
func exitCode(err error) int {
	var c *codedError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &c):
		return c.code
	case errors.Is(err, errUsage):
		return exitUsage
	}
	return exitError
}
