// Package pgtest runs a throwaway PostgreSQL server for tests: initdb into a temporary
// directory, postgres on a free 127.0.0.1 port, a fresh database per test, and everything
// stopped and removed at the end.
//
// One server per test:
//
//	dsn := pgtest.Start(t)
//
// One server per package, started on first use, a fresh database per test:
//
//	var pg pgtest.Shared
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		pg.Stop()
//		os.Exit(code)
//	}
//
//	func TestX(t *testing.T) { dsn := pg.Database(t); ... }
//
// The binaries (initdb, pg_ctl, postgres) are looked up in $KDS_TEST_POSTGRES_BIN, then
// /usr/lib/postgresql/15/bin, then PATH, then the newest /usr/lib/postgresql/*/bin. Missing
// binaries fail the test with a message saying what to install; KDS_SKIP_POSTGRES=1 skips the
// PostgreSQL tests instead. KDS_TEST_POSTGRES_DSN=postgres://... uses an existing server (its
// user needs CREATEDB): each test gets a database created on it and dropped afterwards.
//
// initdb refuses to run as root, so as root the server runs as the "postgres" user.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment variables the package reads.
const (
	EnvDSN  = "KDS_TEST_POSTGRES_DSN" // use this server instead of starting one
	EnvSkip = "KDS_SKIP_POSTGRES"     // "1": skip PostgreSQL tests
	EnvBin  = "KDS_TEST_POSTGRES_BIN" // directory holding initdb, pg_ctl and postgres
)

// StartTimeout bounds starting a server (initdb and waiting until it accepts connections).
const StartTimeout = 60 * time.Second

// ErrNoBinaries: initdb, pg_ctl or postgres was not found.
var ErrNoBinaries = errors.New("PostgreSQL server binaries not found")

// Server is a running PostgreSQL server: one this package started, or the one EnvDSN names.
type Server struct {
	adminDSN string // a superuser (or CREATEDB) DSN to the "postgres" database
	external bool

	// For a server this package started:
	bin     string // directory of the binaries
	dir     string // temporary directory: data/, the socket, postgres.log
	cred    *syscall.Credential
	durable bool // synchronous_commit on: a commit survives the server's crash (Halt)
	// settings are more -c settings, "name=value" each (StartServerWith).
	settings []string
	proc     *os.Process
	exited   chan struct{} // closed when the postgres process has exited
	waitErr  error         // the process's exit status, set before exited is closed
	log      string
}

// Skipped reports whether KDS_SKIP_POSTGRES=1 asks to skip PostgreSQL tests.
func Skipped() bool { return os.Getenv(EnvSkip) == "1" }

// StartServer starts a server (or connects to the one EnvDSN names) and waits until it accepts
// connections. It fails with ErrNoBinaries when there is nothing to start.
func StartServer(ctx context.Context) (*Server, error) { return startServer(ctx, false, nil) }

// StartServerWith is StartServer with more server settings, each "name=value" as postgres's -c
// takes it (a bench's shared_preload_libraries=pg_stat_statements). A server EnvDSN names is
// used as it is: its settings are its own.
func StartServerWith(ctx context.Context, settings ...string) (*Server, error) {
	return startServer(ctx, false, settings)
}

// StartDurableServer is StartServer for a server whose commits survive its crash (Halt):
// synchronous_commit stays on (StartServer turns it off, for speed, so a crash may lose the
// last commits it acknowledged). For fault injection that checks nothing acknowledged is lost.
func StartDurableServer(ctx context.Context) (*Server, error) { return startServer(ctx, true, nil) }

func startServer(ctx context.Context, durable bool, settings []string) (*Server, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return external(ctx, dsn)
	}
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()

	s := &Server{bin: bin, durable: durable, settings: settings}
	if os.Geteuid() == 0 {
		if s.cred, err = postgresUser(); err != nil {
			return nil, err
		}
	}
	base := tempBase()
	sweep(base)
	if s.dir, err = os.MkdirTemp(base, dirPrefix); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := s.chown(s.dir); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	s.log = filepath.Join(s.dir, "postgres.log")
	if err := s.initdb(ctx); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	// The free port can be taken between choosing and binding it: try a few.
	for attempt := 1; ; attempt++ {
		err = s.start(ctx)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			_ = os.RemoveAll(s.dir)
			return nil, err
		}
	}
}

func external(ctx context.Context, dsn string) (*Server, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("pgtest: %s must be a postgres://user:password@host:port/db URL", EnvDSN)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect to %s (%s): %w", u.Redacted(), EnvDSN, err)
	}
	_ = conn.Close(ctx)
	return &Server{adminDSN: dsn, external: true}, nil
}

// findBinaries returns the directory holding initdb, pg_ctl and postgres.
func findBinaries() (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv(EnvBin); dir != "" {
		if has(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("pgtest: %w in %s=%s (want initdb, pg_ctl and postgres there); set %s=1 to skip the PostgreSQL tests",
			ErrNoBinaries, EnvBin, dir, EnvSkip)
	}
	if has("/usr/lib/postgresql/15/bin") {
		return "/usr/lib/postgresql/15/bin", nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		// Resolve symlinks (/usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb) so the
		// three binaries come from one installation.
		if r, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(r)) {
			return filepath.Dir(r), nil
		}
		if has(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("pgtest: %w (looked in $%s, /usr/lib/postgresql/15/bin, PATH, /usr/lib/postgresql/*/bin); "+
		"install them (Debian: apt-get install postgresql-15), point %s at a running server, or set %s=1 to skip the PostgreSQL tests",
		ErrNoBinaries, EnvBin, EnvDSN, EnvSkip)
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// postgresUser is the credential to run the server as when the tests run as root.
func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, and initdb refuses to: need a \"postgres\" user to run the server as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgtest: user postgres has a non-numeric uid/gid %s/%s", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (s *Server) chown(path string) error {
	if s.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
		return fmt.Errorf("pgtest: chown %s to postgres: %w", path, err)
	}
	return nil
}

// command is a PostgreSQL binary run as the server's user, in the server's directory.
func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	cmd.SysProcAttr = sysProcAttr(s.cred)
	return cmd
}

func (s *Server) initdb(ctx context.Context) error {
	cmd := s.command(ctx, "initdb", "-D", filepath.Join(s.dir, "data"), "--username=postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	return nil
}

const dirPrefix = "kds-pgtest-"

// sweep removes the directories of servers whose test binary died without cleaning up (the
// server itself died with it): no live postmaster, and old enough not to be one starting now.
func sweep(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < 10*time.Minute {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(d, "data", "postmaster.pid")); err == nil {
			first, _, _ := strings.Cut(string(b), "\n")
			if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && pid > 0 {
				if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
					continue // still running
				}
			}
		}
		_ = os.RemoveAll(d)
	}
}

var errPortTaken = errors.New("port taken")

// start runs postgres on a free port and waits until it accepts connections.
func (s *Server) start(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	return s.startOn(ctx, port)
}

// startOn runs postgres on port and waits until it accepts connections.
func (s *Server) startOn(ctx context.Context, port int) error {
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer logf.Close()
	// fsync off: the machine does not crash under a test, only the server may (its writes
	// are in the OS's cache); synchronous_commit off unless durable: a crash may lose the last
	// acknowledged commits.
	syncCommit := "synchronous_commit=off"
	if s.durable {
		syncCommit = "synchronous_commit=on"
	}
	args := []string{"-D", filepath.Join(s.dir, "data"),
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + s.dir,
		"-c", "fsync=off", "-c", syncCommit, "-c", "full_page_writes=off",
		"-c", "logging_collector=off", "-c", "max_connections=200",
		// Shared memory segments in the data directory, not /dev/shm: a killed server
		// leaves nothing behind outside its directory.
		"-c", "dynamic_shared_memory_type=mmap"}
	for _, setting := range s.settings {
		args = append(args, "-c", setting)
	}
	// No CommandContext here: the server outlives ctx, which only bounds the start.
	cmd := s.command(context.Background(), "postgres", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := s.run(cmd); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	s.adminDSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	for {
		conn, err := pgx.Connect(ctx, s.adminDSN)
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		select {
		case <-s.exited:
			logTail := s.logTail()
			if strings.Contains(logTail, "already in use") {
				return fmt.Errorf("pgtest: %w: %d", errPortTaken, port)
			}
			return fmt.Errorf("pgtest: postgres exited (%v) before accepting connections; %s:\n%s", s.waitErr, s.log, logTail)
		case <-ctx.Done():
			s.kill()
			return fmt.Errorf("pgtest: postgres on 127.0.0.1:%d not ready within %v: %v; %s:\n%s", port, StartTimeout, err, s.log, s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// run starts cmd from a goroutine locked to its OS thread, which stays alive until the process
// exits: Pdeathsig is tied to the thread that started the child, so the server dies with the
// test binary even when cleanup never runs (a panic, a timeout).
func (s *Server) run(cmd *exec.Cmd) error {
	s.exited = make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread ends with this goroutine, after the process.
		if err := cmd.Start(); err != nil {
			started <- err
			close(s.exited)
			return
		}
		s.proc = cmd.Process
		started <- nil
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	return <-started
}

// kill stops the server: pg_ctl stop -m immediate, then SIGKILL if it is still running.
func (s *Server) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = s.command(ctx, "pg_ctl", "stop", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "-t", "15").Run()
	select {
	case <-s.exited:
		return
	case <-time.After(5 * time.Second):
	}
	_ = s.proc.Kill()
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(bytes.TrimSpace(b))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Halt stops a started server at once, as a crash would (pg_ctl stop -m immediate), keeping its
// data; Resume starts it again on the same port. For fault injection (examples/chaos).
func (s *Server) Halt() error {
	if s.external || s.dir == "" {
		return errors.New("pgtest: only a server this package started can be halted")
	}
	s.kill()
	select {
	case <-s.exited:
		return nil
	default:
		return fmt.Errorf("pgtest: postgres in %s did not stop", s.dir)
	}
}

// Resume starts a halted server again on its port, within StartTimeout.
func (s *Server) Resume(ctx context.Context) error {
	if s.external || s.dir == "" {
		return errors.New("pgtest: only a server this package started can be resumed")
	}
	u, err := url.Parse(s.adminDSN)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return fmt.Errorf("pgtest: the server's port: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	return s.startOn(ctx, port)
}

// Pid is the postmaster's process id, 0 for a server EnvDSN names or one not running: its
// backends are its children, so a benchmark can read the server's CPU from /proc.
func (s *Server) Pid() int {
	if s.external || s.proc == nil {
		return 0
	}
	return s.proc.Pid
}

// AdminDSN is a DSN to the server's "postgres" database with the server's superuser (or, for
// an external server, the EnvDSN itself).
func (s *Server) AdminDSN() string { return s.adminDSN }

// CreateDatabase creates an empty database with a fresh name and returns its DSN.
func (s *Server) CreateDatabase(ctx context.Context) (dsn, name string, err error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name = "kds_test_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return "", "", fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	u, err := url.Parse(s.adminDSN)
	if err != nil {
		return "", "", fmt.Errorf("pgtest: %w", err)
	}
	u.Path = "/" + name
	return u.String(), name, nil
}

// DropDatabase drops a database CreateDatabase made, disconnecting its sessions.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

// Database creates a fresh database for t and returns its DSN; it is dropped when t ends
// (after t's own cleanups, so close what uses it in a t.Cleanup or before t returns).
func (s *Server) Database(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, name, err := s.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.DropDatabase(ctx, name); err != nil {
			t.Error(err)
		}
	})
	return dsn
}

// Stop stops a started server (pg_ctl stop -m immediate) and removes its directory. For an
// external server it does nothing.
func (s *Server) Stop() error {
	if s == nil || s.external || s.dir == "" {
		return nil
	}
	s.kill()
	select {
	case <-s.exited:
	default:
		return fmt.Errorf("pgtest: postgres in %s did not stop", s.dir)
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	s.dir = ""
	return nil
}

// Start starts a server for t alone and returns the DSN of a fresh database on it; the server
// is stopped and removed when t ends. It fails t when the server cannot start, and skips t when
// KDS_SKIP_POSTGRES=1.
func Start(t testing.TB) (dsn string) {
	t.Helper()
	if Skipped() {
		t.Skipf("%s=1: skipping PostgreSQL test", EnvSkip)
	}
	s, err := StartServer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	return s.Database(t)
}

// Shared is one server for a whole test binary, started by the first Database call and
// stopped by Stop (call it from TestMain after m.Run). The zero value is ready to use.
type Shared struct {
	mu  sync.Mutex // guards srv and err
	srv *Server
	err error
}

// Database returns the DSN of a fresh database on the shared server, starting it on first
// use. It fails t when the server cannot start (every later call fails the same way without
// trying again), and skips t when KDS_SKIP_POSTGRES=1.
func (sh *Shared) Database(t testing.TB) string {
	t.Helper()
	if Skipped() {
		t.Skipf("%s=1: skipping PostgreSQL test", EnvSkip)
	}
	sh.mu.Lock()
	if sh.srv == nil && sh.err == nil {
		sh.srv, sh.err = StartServer(context.Background())
	}
	srv, err := sh.srv, sh.err
	sh.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	return srv.Database(t)
}

// Stop stops the shared server if Database started one.
func (sh *Shared) Stop() error {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	err := sh.srv.Stop()
	sh.srv = nil
	return err
}
