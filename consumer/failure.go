package consumer

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/d419a114/outbox/deadletter"
)

// fingerprint returns the reason a record failed with err after attempts runs
// of its handler (0: it never reached the handler), and its failure
// fingerprint: the reason with, for a panic, the panic value's type and the
// first frame of the handler's stack, and otherwise the type of the error
// at the bottom of err's chain (unless errors.New or fmt.Errorf made it)
// and its wording with numbers and quoted strings masked, so that
// the same fault in different records (other ids, other amounts) groups
// together.
func fingerprint(err error, attempts int) (reason deadletter.Reason, failure string) {
	var (
		pe  *PanicError
		te  *HandlerTimeoutError
		sre *SequenceReusedError
		cde *ConflictingDuplicateError
	)
	switch {
	case errors.As(err, &pe):
		return deadletter.ReasonPanic, fmt.Sprintf("panic %T at %s", pe.Value, firstFrame(string(pe.Stack)))
	case errors.As(err, &te):
		return deadletter.ReasonTimeout, fmt.Sprintf("timeout after %s", te.Timeout)
	case errors.Is(err, ErrDeliveryLimit):
		return deadletter.ReasonDeliveryLimit, string(deadletter.ReasonDeliveryLimit)
	case errors.As(err, &cde):
		return deadletter.ReasonConflict, "conflict: idempotency key claimed by another event"
	case errors.As(err, &sre):
		return deadletter.ReasonSequence, "sequence: " + masked(err.Error())
	case attempts == 0:
		return deadletter.ReasonInput, "input: " + masked(err.Error())
	}
	if t := fmt.Sprintf("%T", root(err)); !plainErrors[t] {
		return deadletter.ReasonHandler, fmt.Sprintf("handler %s: %s", t, masked(err.Error()))
	}
	return deadletter.ReasonHandler, "handler: " + masked(err.Error())
}

// plainErrors are the types of errors.New and fmt.Errorf, which say
// nothing about a failure that its wording does not.
var plainErrors = map[string]bool{"*errors.errorString": true, "*fmt.wrapError": true, "*fmt.wrapErrors": true, "*errors.joinError": true}

// root is the error at the bottom of err's chain, following the first
// branch of a joined error.
func root(err error) error {
	for {
		switch u := err.(type) { //nolint:errorlint // walks the chain itself, one link at a time
		case interface{ Unwrap() error }:
			next := u.Unwrap()
			if next == nil {
				return err
			}
			err = next
		case interface{ Unwrap() []error }:
			next := u.Unwrap()
			if len(next) == 0 {
				return err
			}
			err = next[0]
		default:
			return err
		}
	}
}

var (
	digits = regexp.MustCompile(`[0-9]+`)
	quoted = regexp.MustCompile(`"[^"]*"|'[^']*'`)
)

// maxFailure bounds the wording a fingerprint keeps.
const maxFailure = 160

// masked is msg with quoted strings and numbers masked, cut to maxFailure
// bytes at a rune boundary.
func masked(msg string) string {
	msg = digits.ReplaceAllString(quoted.ReplaceAllString(msg, `"…"`), "N")
	if len(msg) <= maxFailure {
		return msg
	}
	cut := maxFailure
	for cut > 0 && !isRuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut]
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// firstFrame is the function that panicked, read from a debug.Stack of the
// recovering goroutine: the first frame after the panic call that is not
// the runtime's, without its arguments; "unknown" when there is none.
func firstFrame(stack string) string {
	lines := strings.Split(stack, "\n")
	after := false
	for _, l := range lines {
		if strings.HasPrefix(l, "\t") || l == "" {
			continue
		}
		if strings.HasPrefix(l, "panic(") {
			after = true
			continue
		}
		if !after || strings.HasPrefix(l, "runtime.") {
			continue
		}
		if i := strings.LastIndex(l, "("); i > 0 {
			l = l[:i]
		}
		return l
	}
	return "unknown"
}
