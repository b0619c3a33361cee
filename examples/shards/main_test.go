package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRun: every order's events are applied once, in sequence, in its
// region's target, and the moved order's sequence goes on across its move.
func TestRun(t *testing.T) {
	srv, err := pgtest.Shared()
	require.NoError(t, err)
	t.Setenv("DATABASE_URL", srv.URL)
	var out strings.Builder
	require.NoError(t, run(context.Background(), &out))
	require.Contains(t, out.String(), "moved eu-1 from tenant-a to tenant-c: done\n")
	require.Contains(t, out.String(), "target eu applied: eu-1 1 placed, eu-1 2 paid, eu-1 3 packed, eu-1 4 shipped, "+
		"eu-2 1 placed, eu-2 2 paid, eu-2 3 packed, eu-2 4 shipped\n")
	require.Contains(t, out.String(), "target us applied: us-1 1 placed, us-1 2 paid, us-1 3 packed, us-1 4 shipped, "+
		"us-2 1 placed, us-2 2 paid, us-2 3 packed, us-2 4 shipped\n")
}
