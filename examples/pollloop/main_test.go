package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestRun(t *testing.T) {
	srv, err := pgtest.Shared()
	require.NoError(t, err)
	t.Setenv("DATABASE_URL", srv.URL)
	var out strings.Builder
	require.NoError(t, run(context.Background(), &out))
	require.Contains(t, out.String(), "applied, in order per order: 7: paid, 7: packed, 9: paid, 9: packed\n")
	require.Contains(t, out.String(), "key=7: duplicate")
	require.Contains(t, out.String(), "no idempotency key")
}
