package soak_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/integration/soak"
	"github.com/d419a114/outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestSoakShort runs the soak for a few seconds with a fault every few
// hundred milliseconds, at Concurrency 1 and 16: the pipeline must drain
// and the history keep the guarantees.
func TestSoakShort(t *testing.T) {
	for _, c := range []int{1, 16} {
		t.Run(fmt.Sprintf("concurrency=%d", c), func(t *testing.T) { soakShort(t, c) })
	}
}

func soakShort(t *testing.T, concurrency int) {
	srv, err := pgtest.Shared()
	require.NoError(t, err)
	cfg := soak.Config{
		Duration:      6 * time.Second,
		DatabaseURL:   srv.URL,
		Writers:       4,
		Aggregates:    50,
		Concurrency:   concurrency,
		FaultEvery:    400 * time.Millisecond,
		ProgressEvery: 2 * time.Second,
		Progress:      logWriter{t},
	}
	if b := os.Getenv("KAFKA_BROKERS"); b != "" {
		cfg.Brokers = strings.Split(b, ",")
	}
	res, err := soak.Run(context.Background(), cfg)
	require.NoError(t, err)
	t.Logf("\n%s", res)
	require.Positive(t, res.Report.Committed)
	require.True(t, res.OK(), "the history breaks a guarantee:\n%s", res)
	require.Positive(t, res.Applied)
}
