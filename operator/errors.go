package operator

import "errors"

var (
	// ErrInvalid is wrapped by Submit's error for a request that names no
	// consumer, no known action, or no letters or aggregate to act on.
	ErrInvalid = errors.New("operator: invalid request")
	// ErrClaimLost is returned by a fenced write (Renew, Count, Report,
	// Finish) of a process whose claim on the request is no longer the
	// current one: its lease ran out and another process took the
	// request up. The process must stop carrying the request out and
	// write nothing more about it; an action whose transaction saw this
	// error rolls back.
	ErrClaimLost = errors.New("operator: claim on the request lost to another process")
	// ErrCancelled is returned by Renew, Count and Report for a request
	// that was cancelled ([Store.Cancel]) while a process carried it out:
	// the process must stop before its next action, and an action whose
	// transaction saw this error rolls back.
	ErrCancelled = errors.New("operator: request cancelled")
	// ErrFinished is returned by Cancel for a request that has ended
	// already.
	ErrFinished = errors.New("operator: request finished already")
)
