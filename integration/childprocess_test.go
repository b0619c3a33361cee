package integration

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// childProcess is this test binary running in a child process as a relay
// or a consumer member (TestMain sends it to its part by its environment),
// so that a test can end it with SIGKILL.
type childProcess struct {
	kind, name string
	cmd        *exec.Cmd
	mu         sync.Mutex
	out        bytes.Buffer // the child's log
	done       chan struct{}
}

// startChild starts this test binary with env added to the environment,
// collects its log, and stops it with SIGTERM when the test ends if it
// still runs (SIGKILL after 60 s); its log is printed when the test failed.
func (s *scenario) startChild(kind, name string, env ...string) *childProcess {
	s.t.Helper()
	exe, err := os.Executable()
	require.NoError(s.t, err)
	p := &childProcess{kind: kind, name: name, done: make(chan struct{})}
	p.cmd = exec.Command(exe, "-test.run=^$")
	p.cmd.Env = append(os.Environ(), env...)
	stderr, err := p.cmd.StderrPipe()
	require.NoError(s.t, err)
	require.NoError(s.t, p.cmd.Start())
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		_ = p.cmd.Wait()
	}()
	s.t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(60 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if s.t.Failed() {
			s.t.Logf("log of %s process %s:\n%s", kind, name, p.log())
		}
	})
	return p
}

func (p *childProcess) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// kill ends the process with SIGKILL and waits until it is gone.
func (p *childProcess) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Kill())
	waitClosed(t, p.done, 30*time.Second, p.kind+" process "+p.name+" to exit")
}
