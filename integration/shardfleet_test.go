package integration

import (
	"context"
	"fmt"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/producer"
	"github.com/d419a114/outbox/shard"
)

// fleetProcess is one running relay fleet over every shard, standing in for
// a process: its connections carry an application_name of their own.
type fleetProcess struct {
	name   string
	app    string
	cancel context.CancelFunc
	done   chan error
	client *kgo.Client
}

// startFleet runs a fleet over all shards, named name (its incarnation
// goes into its relay id and application_name).
func (w *shardWorld) startFleet(name string, incarnation int) *fleetProcess {
	w.t.Helper()
	client, err := kgo.NewClient(
		kgo.SeedBrokers(w.broker.Addrs...),
		kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }),
		kgo.MetadataMinAge(50*time.Millisecond),
	)
	require.NoError(w.t, err)
	app := fmt.Sprintf("scn_fleet_%s_%d", name, incarnation)
	cfg := producer.FleetConfig{Relay: scenarioRelayConfig(), ApplicationName: app}
	cfg.Relay.RelayID = app
	cfg.Relay.Logger = testLogger(w.t, app)
	shards := make([]shard.Shard, len(w.shards))
	for i, s := range w.shards {
		shards[i] = s.shard
	}
	fleet, err := producer.NewFleet(client, shards, &cfg)
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	f := &fleetProcess{name: name, app: app, cancel: cancel, done: make(chan error, 1), client: client}
	go func() { f.done <- fleet.Run(ctx) }()
	w.t.Cleanup(func() { w.stopFleet(f) })
	return f
}

// killFleet kills a fleet as its process' death would: its sessions on
// every cluster are terminated and its Kafka client closed under it
// (failing the records it buffered), then it is cancelled.
func (w *shardWorld) killFleet(f *fleetProcess) int {
	w.t.Helper()
	n := 0
	for _, s := range w.shards {
		n += terminateApp(w.t, s.db, f.app)
	}
	f.client.Close()
	w.stopFleet(f)
	return n
}

// stopFleet cancels the fleet and waits for Run; it may be called again.
func (w *shardWorld) stopFleet(f *fleetProcess) {
	f.cancel()
	select {
	case err, ok := <-f.done:
		if ok {
			require.NoError(w.t, err)
			close(f.done)
		}
	case <-time.After(60 * time.Second):
		w.t.Fatalf("fleet %s did not return within 60s of cancellation", f.app)
	}
	f.client.Close()
}
