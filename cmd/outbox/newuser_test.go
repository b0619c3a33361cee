package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/operator"
)

// TestNewUser: what a first-time user types gets help, or an error that
// names the fix, never a raw SQLSTATE or an empty answer that looks fine.
func TestNewUser(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w, _ := consumerWithLetters(t)
	db, p := w.DB, w.Proc
	ls, err := p.Inspector().Letters(ctx, &deadletter.ListOpts{Consumer: p.Name()})
	require.NoError(t, err)
	id := strconv.FormatInt(ls[0].ID, 10)
	exec := func(args ...string) (string, error) {
		var out bytes.Buffer
		full := append(append([]string{}, args...), "-database", db.Server.URL, "-schema", db.Schema)
		err := run(ctx, full, &out)
		return out.String(), err
	}

	for _, help := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		var out bytes.Buffer
		require.NoError(t, run(ctx, help, &out), "%v", help)
		require.Contains(t, out.String(), "outbox letters list", "%v", help)
	}
	out, err := exec("letters", "list", "-h")
	require.NoError(t, err)
	require.Contains(t, out, "usage:\n  outbox letters list")
	require.Contains(t, out, "-reason", "a command's help lists its own flags")
	require.NotContains(t, out, "-listen", "and no other command's")

	t.Run("FlagOfAnotherCommand", func(t *testing.T) {
		// A filter given to a command that does not filter would be
		// silently ignored: it is refused, naming who takes it.
		_, err := exec("letters", "show", id, "-reason", "handler")
		require.Equal(t, exitUsage, exitCode(err))
		require.ErrorContains(t, err, "letters show does not take -reason; letters discard, letters list, letters replay do")
		_, err = exec("health", "-listen", ":1")
		require.Equal(t, exitUsage, exitCode(err))
	})

	t.Run("FlagsAfterTheID", func(t *testing.T) {
		out, err := exec("letters", "show", id, "-o", "json")
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(out, "{"), "-o json after the id is read: %s", out)
		_, err = exec("letters", "replay", id, "-wait", "1ms", "-by", "alice")
		require.Equal(t, exitPending, exitCode(err), "-wait after the id is read: %v", err)
	})

	t.Run("UnmigratedSchema", func(t *testing.T) {
		var out bytes.Buffer
		err := run(ctx, []string{"letters", "list", "-database", db.Server.URL, "-schema", "never_migrated"}, &out)
		require.ErrorIs(t, err, outbox.ErrNotMigrated)
		require.ErrorContains(t, err, "outbox migrate -schema never_migrated")
		require.NotContains(t, err.Error(), "SQLSTATE")
	})

	t.Run("UnknownConsumer", func(t *testing.T) {
		for _, args := range [][]string{{"letters", "list", "-consumer", "nosuch"}, {"letters", "replay", "-consumer", "nosuch", "-all", "-by", "alice"}, {"gaps", "list", "-consumer", "nosuch"}} {
			_, err := exec(args...)
			require.Equal(t, exitNotFound, exitCode(err), "%v: %v", args, err)
			require.ErrorContains(t, err, `consumer "nosuch" has nothing`)
			require.ErrorContains(t, err, "known consumers: billing")
		}
		rs, err := operator.New(&operator.Config{Schema: db.Schema}).List(ctx, db.Pool, &operator.ListOpts{Consumer: "nosuch"})
		require.NoError(t, err)
		require.Empty(t, rs, "nothing submitted to a consumer that does not exist")
	})

	t.Run("ErrorColumnShowsTheCause", func(t *testing.T) {
		out, err := exec("letters", "list")
		require.NoError(t, err)
		require.Contains(t, out, "charge o-1: card processor d", "the handler's words first")
		require.NotContains(t, out, "consumer: ")
	})

	t.Run("NoActorIsAUsageError", func(t *testing.T) {
		_, err := exec("dead", "replay", "1", "-by", "")
		require.Equal(t, exitUsage, exitCode(err))
		require.ErrorContains(t, err, "-by NAME")
	})

	require.Equal(t, "over 30s: context deadline exceeded", errorTail("consumer: handler did not finish within Config.HandlerTimeout (30s): context deadline exceeded"))
	require.Equal(t, "runtime error: boom", errorTail("consumer: handler panicked: runtime error: boom"))
}

// TestTableFits: a table whose fixed columns leave the last too little
// room still fits 80 columns, as the requests table did not (81 to 84).
func TestTableFits(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	row := []string{"123456", "billing-service", "resolve_gap", "cancelled", "operator-on-call", "3d", "10000/10000", "10000", "10000", "the error"}
	require.NoError(t, table(&out, []string{"ID", "CONSUMER", "ACTION", "STATUS", "BY", "AGE", "DONE", "DRAINED", "FAILED", "ERROR"},
		[][]string{row}, []int{0, 12, 0, 0, 10, 0, 0, 0, 0, 0}))
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		require.LessOrEqual(t, len([]rune(line)), 80, line)
	}
}
