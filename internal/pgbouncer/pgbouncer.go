// Package pgbouncer starts Debian's PgBouncer (/usr/sbin/pgbouncer) in
// front of a test's PostgreSQL server, for the tests that check the SDK
// behind a connection pooler: in transaction mode, where a client's
// statements outside a transaction may each run on another server session,
// and in session mode, where a client keeps one server session.
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Binary is where Debian's pgbouncer package installs the program.
const Binary = "/usr/sbin/pgbouncer"

// RequireEnv names the variable that, set to anything, makes Start fail a
// test instead of skipping it when Binary is missing; CI sets it, so that a
// missing package cannot pass for a green run.
const RequireEnv = "OUTBOX_REQUIRE_PGBOUNCER"

// Mode is PgBouncer's pool_mode.
type Mode string

const (
	// Session pooling: a client keeps one server session until it
	// disconnects.
	Session Mode = "session"
	// Transaction pooling: a client holds a server session only for the
	// length of a transaction; statements outside one may each run on
	// another session.
	Transaction Mode = "transaction"
)

// Opts tunes Start.
type Opts struct {
	// PoolSize is default_pool_size, the server sessions per database and
	// user. Default 10.
	PoolSize int
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	// URL connects through the pooler to the server's database, as the
	// server's URL did.
	URL string
	// Mode is the pool mode it runs in.
	Mode Mode
}

// Start runs PgBouncer in mode in front of the server serverURL points at,
// on a free loopback port, with its configuration, trust authentication
// and log in a temporary directory, and stops it when the test ends. It
// skips the test when Binary is missing, unless RequireEnv is set: then it
// fails it. As root, PgBouncer runs as the postgres user, since it refuses
// to run as root.
func Start(t testing.TB, serverURL string, mode Mode, opts *Opts) *Bouncer {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("pgbouncer: %s is missing and %s is set; install Debian's pgbouncer package (apt-get install pgbouncer)", Binary, RequireEnv)
		}
		t.Skipf("pgbouncer: %s is missing; install Debian's pgbouncer package, or set %s to fail instead of skipping", Binary, RequireEnv)
	}
	if opts == nil {
		opts = &Opts{}
	}
	poolSize := opts.PoolSize
	if poolSize == 0 {
		poolSize = 10
	}
	server, err := pgx.ParseConfig(serverURL)
	require.NoError(t, err)

	dir, err := os.MkdirTemp("", "outbox-pgbouncer-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred, err = postgresUser()
		require.NoError(t, err)
		require.NoError(t, os.Chown(dir, int(cred.Uid), int(cred.Gid)))
	}
	port, err := freePort()
	require.NoError(t, err)
	logPath := filepath.Join(dir, "pgbouncer.log")
	userlist := filepath.Join(dir, "userlist.txt")
	ini := filepath.Join(dir, "pgbouncer.ini")
	// auth_type=trust still needs the user in auth_file. pgx sends no
	// startup parameter PgBouncer rejects, but other drivers send
	// extra_float_digits.
	conf := fmt.Sprintf(`[databases]
* = host=%s port=%d user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 1000
logfile = %s
ignore_startup_parameters = extra_float_digits
`, server.Host, server.Port, server.User, port, userlist, mode, poolSize, logPath)
	require.NoError(t, os.WriteFile(userlist, fmt.Appendf(nil, "%q \"\"\n", server.User), 0o644)) //nolint:gosec // the pooler runs as another user and must read it
	require.NoError(t, os.WriteFile(ini, []byte(conf), 0o644))                                    //nolint:gosec // as above

	cmd := exec.Command(Binary, ini) //nolint:gosec // Binary is a constant; ini is this function's own file
	// Pdeathsig stops the pooler if the test binary dies without running
	// its clean-up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(dir, "stderr.log")) //nolint:gosec // in this function's own temporary directory
	require.NoError(t, err)
	defer func() { _ = out.Close() }()
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start(), "pgbouncer: start %s", Binary)
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		// SIGTERM is PgBouncer's immediate shutdown; SIGINT would wait for
		// clients a failed test may have left connected.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	b := &Bouncer{Mode: mode, URL: fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", server.User, port, server.Database)}
	if err := waitReady(b.URL, exited); err != nil {
		log, _ := os.ReadFile(logPath) //nolint:gosec // as above
		stderr, _ := os.ReadFile(out.Name())
		t.Fatalf("pgbouncer: %v\nlog:\n%s\nstderr:\n%s", err, log, stderr)
	}
	return b
}

// waitReady connects through the pooler until a query gets through.
func waitReady(url string, exited <-chan struct{}) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT 1")
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited during start-up")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within 30s: %w", err)
		}
	}
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: running as root needs a postgres user to run PgBouncer as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: uid of the postgres user: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: gid of the postgres user: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgbouncer: find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
