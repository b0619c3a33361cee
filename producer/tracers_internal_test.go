package producer

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

type bareTracer struct{}

func (bareTracer) TracePublishStart(ctx context.Context, _ []*kgo.Record) context.Context { return ctx }
func (bareTracer) TracePublishEnd(context.Context, []*kgo.Record, PublishResult, error)   {}

type pruneTracer struct {
	bareTracer
	prunes *int
}

func (p pruneTracer) TracePrune(context.Context, PruneResult, error) { *p.prunes++ }

// The relay calls an optional hook of Tracers only when one of its
// tracers implements it, though Tracers' result implements every one.
func TestRelayTracersOfTracers(t *testing.T) {
	t.Parallel()
	bare := newRelayTracers(Tracers(bareTracer{}, bareTracer{}))
	require.NotNil(t, bare.publish)
	require.Nil(t, bare.claim)
	require.Nil(t, bare.rebalance)
	require.Nil(t, bare.listener)
	require.Nil(t, bare.prune)

	prunes := 0
	some := newRelayTracers(Tracers(bareTracer{}, pruneTracer{prunes: &prunes}))
	require.Nil(t, some.claim)
	require.NotNil(t, some.prune)
	some.prune.TracePrune(context.Background(), PruneResult{}, nil)
	require.Equal(t, 1, prunes)
}
