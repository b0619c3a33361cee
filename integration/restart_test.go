package integration

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/d419a114/outbox/internal/kafkatest"
)

// restartEnv names the shell command that restarts the real broker in
// KAFKA_BROKERS on its own data, for example
// "$PWD/integration/kafka/broker.sh restart" or
// "docker compose -f integration/docker-compose.yml restart kafka".
const restartEnv = "KAFKA_RESTART"

// restartable is a Kafka cluster a test can restart with its data: kfake on
// the same data dir and ports, or the real broker through KAFKA_RESTART.
type restartable struct {
	*kafkatest.Broker
	dir   string // kfake: the data dir
	ports []int  // kfake: the listen ports, kept so that seed addresses stay valid
	cmd   string // real broker: the restart command
}

// restartableBroker returns a cluster the test may restart. A real broker is
// shared by every test of the process, so a test that restarts it must not
// call t.Parallel: Go then runs it while no parallel test runs.
func restartableBroker(t *testing.T) *restartable {
	t.Helper()
	if os.Getenv("KAFKA_BROKERS") != "" {
		cmd := os.Getenv(restartEnv)
		if cmd == "" {
			if os.Getenv(requireRealEnv) != "" {
				t.Fatalf("%s is set but %s is empty; set it to a command that restarts the broker, e.g. \"$PWD/integration/kafka/broker.sh restart\"", requireRealEnv, restartEnv)
			}
			t.Skipf("KAFKA_BROKERS is set but %s is not: cannot restart that broker", restartEnv)
		}
		return &restartable{Broker: broker(t), cmd: cmd}
	}
	dir := t.TempDir()
	b := broker(t, kfake.DataDir(dir))
	r := &restartable{Broker: b, dir: dir}
	for _, addr := range b.Addrs {
		_, port, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		p, err := strconv.Atoi(port)
		require.NoError(t, err)
		r.ports = append(r.ports, p)
	}
	return r
}

// restart stops the cluster and starts it again on the same data and
// addresses. It returns when the cluster accepts connections again.
func (r *restartable) restart(t *testing.T) {
	t.Helper()
	start := time.Now()
	if r.Fake == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "bash", "-c", r.cmd).CombinedOutput()
		require.NoError(t, err, "%s: %s", r.cmd, out)
		t.Logf("Kafka restarted with %q in %s", r.cmd, time.Since(start).Round(time.Millisecond))
		return
	}
	r.Fake.Close() // persists the cluster's state to r.dir
	c, err := kfake.NewCluster(kfake.NumBrokers(len(r.ports)), kfake.DataDir(r.dir), kfake.Ports(r.ports...))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	r.Fake = c
	t.Logf("kfake restarted on %s in %s", r.dir, time.Since(start).Round(time.Millisecond))
}
