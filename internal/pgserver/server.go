// Package pgserver starts a throwaway PostgreSQL cluster from the machine's
// own binaries, for tests and for the example programs, which must not link
// test-only packages.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a PostgreSQL server: one this process started, or one given by
// its URL.
type Server struct {
	// URL connects to the server's postgres database as a superuser.
	URL string

	// Fields below are set only for a cluster this process started; the
	// goroutine that calls Start, Restart or Stop owns them.
	dir     string
	bin     string
	port    int
	cmd     *exec.Cmd
	exited  chan struct{}
	cred    *syscall.Credential
	logPath string
	cfg     Config
}

// Config tunes a cluster that StartConfig starts. The zero value is the
// cluster Start starts.
type Config struct {
	// LogicalReplication starts the server with wal_level=logical (and
	// room for a few replication slots and WAL senders), for change data
	// capture through a logical replication slot (Debezium's pgoutput
	// connector). Default false: wal_level=replica, the server's default.
	LogicalReplication bool
}

// Start initialises a cluster in a temporary directory and starts it on a
// free loopback port. As root, the server runs as the postgres user, since
// PostgreSQL refuses to run as root.
func Start() (*Server, error) { return StartConfig(Config{}) }

// StartConfig is Start for a cluster configured by cfg.
func StartConfig(cfg Config) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outbox-pgserver-")
	if err != nil {
		return nil, fmt.Errorf("pgserver: make cluster directory: %w", err)
	}
	s := &Server{dir: dir, bin: bin, logPath: filepath.Join(dir, "server.log"), cfg: cfg}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgserver: running as root needs a postgres user to run the server as: %w", err)
		}
		uid, err := strconv.ParseUint(u.Uid, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("pgserver: uid of the postgres user: %w", err)
		}
		gid, err := strconv.ParseUint(u.Gid, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("pgserver: gid of the postgres user: %w", err)
		}
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			return nil, fmt.Errorf("pgserver: chown cluster directory: %w", err)
		}
	}
	// bin is the machine's PostgreSQL installation (see binDir).
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.dataDir(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale", "C") //nolint:gosec // the arguments are this function's own
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgserver: initdb: %w\n%s", err, out)
	}
	if s.port, err = freePort(); err != nil {
		return nil, err
	}
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }

// launch starts the postgres process and waits until it accepts connections.
func (s *Server) launch() error {
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("pgserver: open server log: %w", err)
	}
	defer func() { _ = logFile.Close() }()
	args := []string{
		"-D", s.dataDir(),
		"-p", strconv.Itoa(s.port),
		"-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=300",
	}
	if s.cfg.LogicalReplication {
		// initdb's pg_hba.conf with -A trust already lets any local user
		// open a replication connection.
		args = append(args, "-c", "wal_level=logical", "-c", "max_replication_slots=20", "-c", "max_wal_senders=20")
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), args...) //nolint:gosec // the arguments are this package's own
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Pdeathsig stops the server if the test binary dies without running
	// Main's clean-up, so no cluster outlives its tests.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgserver: start postgres: %w", err)
	}
	s.cmd = cmd
	s.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.URL)
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return nil
		}
		select {
		case <-s.exited:
			log, _ := os.ReadFile(s.logPath)
			return fmt.Errorf("pgserver: postgres exited during start-up:\n%s", log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(s.logPath)
			return fmt.Errorf("pgserver: postgres did not accept connections within a minute: %w\n%s", err, log)
		}
	}
}

// Restart stops the server as a crash would (immediate shutdown, no
// checkpoint) and starts it again on the same port, for tests of recovery.
// It works only on a cluster this process started.
func (s *Server) Restart() error {
	if s.cmd == nil {
		return errors.New("pgserver: Restart needs a cluster started by the harness; unset TEST_DATABASE_URL")
	}
	if err := s.halt(syscall.SIGQUIT); err != nil {
		return err
	}
	return s.launch()
}

// Stop shuts the server down quickly and removes its directory. It does
// nothing to a server given by TEST_DATABASE_URL.
func (s *Server) Stop() error {
	if s.cmd == nil {
		return nil
	}
	err := s.halt(syscall.SIGINT) // fast shutdown
	s.cmd = nil
	if rmErr := os.RemoveAll(s.dir); rmErr != nil && err == nil {
		err = fmt.Errorf("pgserver: remove cluster directory: %w", rmErr)
	}
	return err
}

func (s *Server) halt(sig syscall.Signal) error {
	if err := s.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgserver: signal postgres: %w", err)
	}
	select {
	case <-s.exited:
		return nil
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
		return errors.New("pgserver: postgres ignored shutdown for 30s and was killed")
	}
}

// binDir finds the directory of initdb and postgres: PGTEST_BINDIR, then
// PATH, then the newest /usr/lib/postgresql/*/bin (Debian's layout).
func binDir() (string, error) {
	if dir := os.Getenv("PGTEST_BINDIR"); dir != "" {
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(real), nil
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("pgserver: no PostgreSQL binaries found; install them (apt-get install postgresql) or set TEST_DATABASE_URL to a server")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
