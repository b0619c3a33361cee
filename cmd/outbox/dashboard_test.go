package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
)

func TestDashboardCmd(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- dashboardCmd(ctx, db.Pool, db.Schema, "127.0.0.1:0", pw) }()

	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	m := regexp.MustCompile(`^dashboard of schema \S+, read-only, on (http://127\.0\.0\.1:\d+/)\n$`).FindStringSubmatch(line)
	require.NotNil(t, m, line)

	resp, err := http.Get(m[1])
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "<b>read-only</b>")

	resp, err = http.Post(m[1]+"consumers/billing/requests", "application/x-www-form-urlencoded", nil)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "the command never acts")

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("dashboardCmd did not return within 10s of cancellation")
	}

	err = dashboardCmd(context.Background(), db.Pool, db.Schema, "nonsense", io.Discard)
	require.ErrorContains(t, err, "want host:port")
}
