package consumer

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/d419a114/outbox/ordering"
)

// ErrNoKey means a record carries no idempotency key: none of the
// idempotency-key, event-id and Debezium id headers, and no KeyFunc result.
// Such a record is dead-lettered rather than applied without protection
// against duplicates.
var ErrNoKey = errors.New("consumer: record has no idempotency key; set the outbox-idempotency-key, outbox-event-id or id header, or configure Config.KeyFunc")

// ErrClosed is returned by Run when the client was closed.
var ErrClosed = errors.New("consumer: client closed")

// ErrRunning is returned by Run when it was called before on the same
// Consumer: a Consumer runs once.
var ErrRunning = errors.New("consumer: already run; a Consumer runs once")

// ErrWrongConsumer is returned by the operator verbs (Replay, Discard)
// for a dead letter of another consumer.
var ErrWrongConsumer = errors.New("consumer: the dead letter belongs to another consumer")

// ErrNoGap is returned by ResolveGap for an aggregate with no parked
// records: there is nothing to resolve.
var ErrNoGap = errors.New("consumer: the aggregate has no open gap")

// ErrNotNext is returned by Discard and Replay for a dead letter whose
// aggregate still misses an earlier sequence: discarding it would skip that
// one too, and replaying it could only park it. Resolve the earlier gap or
// dead letter first.
var ErrNotNext = errors.New("consumer: an earlier sequence of the aggregate is still missing")

// ErrSequencePassed is returned by Replay for a dead letter whose aggregate
// has moved past its sequence (ResolveGap skipped it, or another event took
// it): applying it now would break the aggregate's order. Discard it.
var ErrSequencePassed = errors.New("consumer: the aggregate has moved past the letter's sequence")

// GapHeldError is returned by ResolveGap when the gap starts with an open
// dead letter: skipping it would lose the letter's event. Replay or
// discard the letter instead.
type GapHeldError struct {
	Aggregate    ordering.Aggregate
	DeadLetterID int64
	Seq          int64
}

func (e *GapHeldError) Error() string {
	return fmt.Sprintf("consumer: the gap of %s is dead letter %d (seq %d); replay or discard it", e.Aggregate, e.DeadLetterID, e.Seq)
}

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

// HandlerTimeoutError reports a handler that did not return within
// [Config.HandlerTimeout]. It counts as a failed attempt: the record is
// retried and, after [Config.MaxAttempts], dead-lettered with this error.
type HandlerTimeoutError struct {
	Timeout time.Duration
	// Err is what the handler returned, typically its context's error.
	Err error
}

func (e *HandlerTimeoutError) Error() string {
	return fmt.Sprintf("consumer: handler did not finish within Config.HandlerTimeout (%s): %v", e.Timeout, e.Err)
}

func (e *HandlerTimeoutError) Unwrap() error { return e.Err }

// SequenceReusedError reports a record whose idempotency key is new but
// whose sequence its aggregate has already passed (or has parked for
// another record): a different event reusing a sequence, which a producer
// bug or a second producer of the aggregate causes. It is permanent: the
// record is dead-lettered and holds nothing back. A true redelivery has the
// same key and is a quiet Duplicate instead.
type SequenceReusedError struct {
	Aggregate ordering.Aggregate
	Seq       int64
	// Position is the aggregate's last applied sequence.
	Position int64
	// Parked is set when another record with Seq is parked, waiting.
	Parked bool
}

func (e *SequenceReusedError) Error() string {
	if e.Parked {
		return fmt.Sprintf("consumer: sequence %d of %s is already parked for another event; a producer reused the sequence: fix the producer, then discard this letter", e.Seq, e.Aggregate)
	}
	return fmt.Sprintf("consumer: sequence %d of %s is behind its aggregate's position %d, and its idempotency key is new: another event took this sequence (a producer reused it), an operator skipped it, or its key was pruned before it came back; fix the producer if it reused the sequence, then discard this letter", e.Seq, e.Aggregate, e.Position)
}

// errClass is what an error says about the record it came with.
type errClass int

const (
	// classRecord: the handler failed for this record. The try counts
	// toward [Config.MaxAttempts] and the record is dead-lettered after the
	// last (at once when the error is Permanent).
	classRecord errClass = iota
	// classTransient: the database or the network failed, or the
	// connection pooler lost a prepared statement. It says nothing about
	// the record: the try does not count, the record is handed back to be
	// processed again, and it is never dead-lettered for it.
	classTransient
	// classData: the database refused the record's own data in the SDK's
	// statements (SQLSTATE classes 22 and 54: a value out of range or too
	// long to index). Retrying cannot help: the record is dead-lettered at
	// once.
	classData
	// classSuspect: the handler's own statement failed with a SQLSTATE
	// that an outage also causes (a statement timeout, a lock timeout, a
	// deadlock, a lost connection). Whose fault it is depends on the
	// database: when it serves other work the record is at fault (a
	// statement that times out every time is no outage) and the try
	// counts; when it does not, nothing counts. Processor.judge decides.
	classSuspect
)

// transientStates are the SQLSTATEs, and classes (two characters), that
// an outage, a failover or contention causes: transient in the SDK's own
// statements, suspect in the handler's (see classSuspect).
var transientStates = map[string]bool{
	"08":    true, // connection exception
	"53":    true, // insufficient resources
	"40001": true, // serialization_failure
	"40P01": true, // deadlock_detected
	"55P03": true, // lock_not_available (lock_timeout)
	"57014": true, // query_canceled (statement_timeout)
	"57P01": true, // admin_shutdown
	"57P02": true, // crash_shutdown
	"57P03": true, // cannot_connect_now
	"25006": true, // read_only_sql_transaction (a switchover left us on a replica)
}

// poolerStates are the SQLSTATEs a connection pooler in transaction mode
// causes under pgx's statement cache (a prepared statement that another
// client's session holds, or that this session lost), and PgBouncer's
// protocol errors. From the SDK's own statements they are a
// deployment's fault, never a record's: transient. From the handler they
// are suspect: a handler can get one of its own making (it executes a
// statement it never prepared) on every try, so Processor.judge counts
// it unless another record got one too within [Config.ContentionSpan]
// (see poolerSeen). The fix is in
// docs/deployment.md: pgx's exec or describe-exec mode, or PgBouncer 1.21
// and later with max_prepared_statements.
var poolerStates = map[string]bool{
	"42P05": true, // duplicate_prepared_statement
	"26000": true, // invalid_sql_statement_name (prepared statement does not exist)
	"08P01": true, // protocol_violation
}

// classify says what err tells about its record; see errClass. A
// *HandlerTimeoutError is the record's, whatever SQLSTATE the cancelled
// statement reported. A *pgconn.PgError is classified by its SQLSTATE
// wherever it came from; an error of the consumer's own statements
// (infra) is transient unless its SQLSTATE says the record's data is at
// fault.
func classify(err error) errClass {
	var te *HandlerTimeoutError
	if errors.As(err, &te) {
		return classRecord
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		code := pe.Code
		switch {
		case poolerStates[code]:
			if isInfra(err) {
				return classTransient
			}
			return classSuspect
		case transientStates[code] || len(code) == 5 && transientStates[code[:2]]:
			if isInfra(err) {
				return classTransient
			}
			return classSuspect
		case isInfra(err) && (strings.HasPrefix(code, "22") || strings.HasPrefix(code, "54")):
			return classData
		}
	}
	if isInfra(err) {
		return classTransient
	}
	return classRecord
}

// isPooler reports whether err carries one of poolerStates.
func isPooler(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && poolerStates[pe.Code]
}

func isInfra(err error) bool {
	var ie *infraError
	return errors.As(err, &ie)
}
