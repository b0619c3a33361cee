package main

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWait(t *testing.T) {
	t.Parallel()

	t.Run("ReadyWhenMetadataAnswers", func(t *testing.T) {
		t.Parallel()
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		require.NoError(t, err)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		md, err := wait(ctx, c.ListenAddrs())
		require.NoError(t, err)
		require.Len(t, md.Brokers, 1)
	})

	t.Run("NotReadyWhenNothingListens", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close()) // a port that refuses connections
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = wait(ctx, []string{addr})
		require.Error(t, err)
		require.Contains(t, err.Error(), "refused")
	})
}
