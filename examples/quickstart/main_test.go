package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestQuickstart runs the README's first command and checks what it
// promises: the rolled-back order never leaves, every committed one is
// applied once, and the second delivery is skipped as a duplicate.
func TestQuickstart(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out))
	got := out.String()
	require.Equal(t, 1, strings.Count(got, ": rolled back\n"), got)
	require.Equal(t, 3, strings.Count(got, "-> applied\n"), got)
	require.Equal(t, 3, strings.Count(got, "-> duplicate\n"), got)
	require.Contains(t, got, "revenue: 3 orders, 7000 cents", got)
	require.Contains(t, got, "health: undelivered=0 oldest=0s dead=0", got)
	require.Regexp(t, `measured: relay delivered 3, failed 0, dead 0, in \d+ batch\(es\); write-to-ack median \S+, max \S+\n`, got)
	require.Contains(t, got, "measured: consumer 3 applied, 3 duplicate; per record median", got)
}
