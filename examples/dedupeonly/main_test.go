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
	require.Equal(t, `pay_1 alice 500: credited
pay_2 bob 250: credited
pay_1 alice 500: duplicate, ignored
pay_3 alice 100: credited
pay_2 bob 250: duplicate, ignored
balances: [alice=600 bob=250]
pruned keys: 0
`, out.String())
}
