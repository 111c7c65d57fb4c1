// Package launch starts a kds-host plugin binary the way the host runs it, for the host's plugin
// runtime and the conformance suite alike.
//
// A plugin started here speaks go-plugin over gRPC with the kds-host handshake and AutoMTLS,
// leads a process group of its own, dies with its parent (Pdeathsig on Linux, set from a thread
// held for the process's lifetime), and is killed in bounded time: go-plugin's Kill, then SIGKILL
// of the whole group. It sees only an allow-listed environment (Options.Env), and a pinned
// binary runs from a private copy of exactly the bytes that were hashed (Options.SHA256). Its
// unix socket goes in a private folder of its own (PLUGIN_UNIX_SOCKET_DIR), which is removed
// once the process is gone, however it ended: killed without Shutdown when the host refused
// its handshake, crashed, or SIGKILLed.
package launch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/kds-host/kds-host/shared"
)

// Options says which binary to start and how. Only Path is required.
type Options struct {
	// Path is the plugin binary; a name without a slash is looked up in $PATH.
	Path string
	// SHA256 pins the binary's checksum. A pinned binary is copied into a private folder
	// (0700, under CopyDir) and hashed as it is copied; a copy that does not match is refused (a
	// *ChecksumError), one that does is made 0500 and is what runs (go-plugin's SecureConfig
	// checks it once more), and the folder is removed once the process is gone. So the process
	// runs exactly the bytes that were hashed, whatever happens to Path meanwhile. Its argv[0]
	// is still Path, but os.Executable in it names the copy. Nil runs whatever is at Path.
	SHA256 []byte
	// PinFolder makes SHA256 the checksum of the folder of Path (FolderChecksum): every file
	// of that folder is copied and hashed, and Path's copy runs among them. A script plugin
	// pinned so runs the script and everything it loads from its folder exactly as hashed.
	PinFolder bool
	// CopyDir is where the private folders of pinned binaries and of plugins' sockets are made
	// (default os.TempDir()). It must allow executables (no noexec mount) and must not let
	// other users rename what is in it (a sticky or private folder).
	CopyDir string
	// Env names the host environment variables the plugin sees besides PATH, HOME and TMPDIR
	// (on Windows PATH, SYSTEMROOT, USERPROFILE, TEMP and TMP), with the host's values; names
	// the host has not set are left out. Nothing else of the host's environment reaches the
	// plugin: only these and what go-plugin adds (its cookie, PLUGIN_* and the AutoMTLS client
	// certificate). A name with "=" in it is an error (see CheckEnv).
	Env []string
	// Plugins are the protocol versions and plugin sets the host offers. Nil offers
	// shared.ClientPluginSets(), which is what the host offers.
	Plugins map[int]plugin.PluginSet
	// Logger receives go-plugin's log, and the plugin's own log lines under its binary's name.
	// Nil discards them.
	Logger hclog.Logger
	// StartTimeout bounds the go-plugin handshake (default 10s).
	StartTimeout time.Duration
	// KillTimeout bounds go-plugin's Kill, which can hang; past it the process group is
	// SIGKILLed (default 5s). go-plugin itself waits 2s for the plugin to exit when asked
	// before it SIGKILLs the plugin's process (not its group); a KillTimeout at or below that
	// takes the kill out of go-plugin's hands.
	KillTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.Plugins == nil {
		o.Plugins = shared.ClientPluginSets()
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 10 * time.Second
	}
	if o.KillTimeout <= 0 {
		o.KillTimeout = 5 * time.Second
	}
	return o
}

// Errors of Kill. Both mean the plugin did not exit when asked and was SIGKILLed.
var (
	// ErrForcedKill: go-plugin asked the plugin to exit, waited, and had to SIGKILL it.
	ErrForcedKill = errors.New("the plugin did not exit when asked: go-plugin SIGKILLed it")
	// ErrKillTimeout: go-plugin's Kill did not return within the kill timeout (a stopped
	// process, or one whose children hold its stdout open), so the launcher SIGKILLed the
	// plugin's process group.
	ErrKillTimeout = errors.New("go-plugin's Kill did not return in time: the process group was SIGKILLed")
)

// Process is one plugin process, started by Start and run by a go-plugin Client. Its keeper
// goroutine starts it, on an OS thread it holds for the process's lifetime (see pinThread), and
// kills it on Kill.
type Process struct {
	opts      Options
	client    *plugin.Client
	cmd       *exec.Cmd
	sigkill   context.CancelFunc // cancels the exec context: the command's Cancel SIGKILLs the group
	stderr    *tail
	pid       int    // set by the keeper before it reports the start
	copyDir   string // the private folder of a pinned binary's copy; removed by the keeper
	socketDir string // the private folder of the plugin's socket; removed by the keeper

	stopOnce sync.Once
	stop     chan struct{} // closed by Kill
	done     chan struct{} // closed by the keeper when the process is gone
	killErr  error         // how the kill went; set by the keeper before done is closed
}

// Start starts the plugin binary and completes the go-plugin handshake: gRPC, AutoMTLS, the
// kds-host cookie, the protocol versions of opts.Plugins, the checksum pin. It fails within the
// start timeout, or when ctx ends, and then leaves no process behind. A binary that does not
// complete the handshake is an error that wraps ErrNotAPlugin and says what it did instead.
func Start(ctx context.Context, opts Options) (*Process, error) {
	opts = opts.withDefaults()
	env, err := pluginEnv(opts.Env)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", opts.Path, err)
	}
	execCtx, sigkill := context.WithCancel(context.Background())
	cmd := exec.CommandContext(execCtx, opts.Path)
	if cmd.Err != nil {
		sigkill()
		return nil, fmt.Errorf("plugin %s: %w", opts.Path, cmd.Err)
	}
	cmd.Env = env
	setProcAttr(cmd)
	p := &Process{
		opts: opts, cmd: cmd, sigkill: sigkill, stderr: &tail{},
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	binSum := opts.SHA256 // what go-plugin's SecureConfig checks the copy against
	if opts.SHA256 != nil {
		var bin, dir string
		var err error
		if opts.PinFolder {
			bin, dir, binSum, err = copyPinnedFolder(cmd.Path, opts.CopyDir, opts.SHA256)
		} else {
			bin, dir, err = copyPinned(cmd.Path, opts.CopyDir, opts.SHA256)
		}
		if err != nil {
			sigkill()
			if ce, ok := errors.AsType[*ChecksumError](err); ok {
				ce.Path = opts.Path
				return nil, ce
			}
			return nil, fmt.Errorf("plugin %s: %w", opts.Path, err)
		}
		cmd.Path, p.copyDir = bin, dir
	}
	// The plugin's socket goes in a folder of the host's, which the keeper removes once the
	// process is gone: a plugin killed without Shutdown (refused at the handshake, hung,
	// crashed) cannot remove its socket itself. go-plugin plugins put it there; others should.
	if p.socketDir, err = os.MkdirTemp(opts.CopyDir, socketPrefix); err != nil {
		sigkill()
		p.removeCopy()
		return nil, fmt.Errorf("plugin %s: a private folder for its socket: %w", opts.Path, err)
	}
	cmd.Env = append(cmd.Env, plugin.EnvUnixSocketDir+"="+p.socketDir)
	cc := shared.ClientConfig(cmd, opts.Logger)
	cc.SkipHostEnv = true // cmd.Env is all of the host's environment the plugin gets
	cc.VersionedPlugins = opts.Plugins
	cc.StartTimeout = opts.StartTimeout
	cc.Stderr = p.stderr
	if opts.SHA256 != nil {
		cc.SecureConfig = &plugin.SecureConfig{Checksum: binSum, Hash: sha256.New()}
	}
	p.client = plugin.NewClient(cc)

	started := make(chan error, 1)
	go p.keep(started)
	select {
	case err = <-started:
	case <-ctx.Done():
		sigkill()
		<-started
		err = ctx.Err() // whatever go-plugin says, the start was called off
	}
	if err != nil {
		_ = p.Kill() // a failed start is killed at once; how does not matter
		return nil, p.startError(err)
	}
	return p, nil
}

// keep owns the process: it starts it, reports the start, waits for Kill, and kills it. It stays
// on one OS thread for all that time so that Pdeathsig (which Linux ties to the thread that
// forked) fires only when the parent process dies.
func (p *Process) keep(started chan<- error) {
	pinThread()
	defer close(p.done)
	defer p.removeCopy()
	defer p.removeSocketDir()
	defer p.sigkill()
	_, err := p.client.Start()
	if err == nil {
		if rc := p.client.ReattachConfig(); rc != nil {
			p.pid = rc.Pid
		}
	}
	started <- err
	if err == nil {
		<-p.stop
	} else {
		// A failed start leaves nothing worth a graceful stop, maybe a program that ignores it.
		p.sigkill()
	}
	running := err == nil && !p.client.Exited()
	p.killErr = p.killBounded()
	// go-plugin's Kill has returned, so it has reaped the process: ProcessState is set. A
	// process that was running and ended by a signal did not exit when asked.
	if running && p.killErr == nil && p.cmd.ProcessState != nil && !p.cmd.ProcessState.Exited() {
		p.killErr = ErrForcedKill
	}
}

// killBounded runs go-plugin's Kill, which asks the plugin to exit and can hang (a stopped
// process never answers), and SIGKILLs the process group if it is not gone within the kill
// timeout.
func (p *Process) killBounded() error {
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		p.client.Kill()
	}()
	timeout := p.opts.KillTimeout
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-killed:
		return nil
	case <-timer.C:
	}
	p.opts.Logger.Warn("plugin did not exit in time: SIGKILL", "path", p.opts.Path, "pid", p.pid, "timeout", timeout)
	p.sigkill()
	timer.Reset(timeout)
	select {
	case <-killed:
		return fmt.Errorf("%w (after %s)", ErrKillTimeout, timeout)
	case <-timer.C:
		// Only a process stuck in the kernel, or descendants that left its process group and
		// hold its stdout open, get here; go-plugin's Kill returns once they are gone.
		p.opts.Logger.Error("plugin still not gone after SIGKILL", "path", p.opts.Path, "pid", p.pid)
		return fmt.Errorf("%w (after %s), and it was still not gone %s later", ErrKillTimeout, timeout, timeout)
	}
}

// removeCopy removes the private folder of a pinned binary's copy, once the process is gone.
func (p *Process) removeCopy() {
	if p.copyDir == "" {
		return
	}
	if err := removeCopy(p.copyDir); err != nil {
		p.opts.Logger.Warn("plugin stopped, but its pinned copy stays", "path", p.opts.Path, "copy", p.copyDir, "error", err)
	}
}

// socketPrefix starts the name of each private folder a plugin's socket is made in.
const socketPrefix = "kds-sock-" // short: a unix socket's path has at most 104 to 108 bytes

// removeSocketDir removes the private folder of the plugin's socket, once the process is gone.
func (p *Process) removeSocketDir() {
	if err := os.RemoveAll(p.socketDir); err != nil {
		p.opts.Logger.Warn("plugin stopped, but the folder of its socket stays", "path", p.opts.Path, "folder", p.socketDir, "error", err)
	}
}

// Client is the go-plugin client that runs the process; its Client method connects to the
// plugin and dispenses.
func (p *Process) Client() *plugin.Client { return p.client }

// Pid is the plugin's process id, which is also its process group's id where there are
// process groups.
func (p *Process) Pid() int { return p.pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool { return p.client.Exited() }

// Kill ends the process: it asks it to exit (go-plugin's Kill), and SIGKILLs its process group
// when that has not returned within the kill timeout. It returns when the process is gone, nil
// when it exited when asked, else an error that wraps ErrForcedKill or ErrKillTimeout. It may
// be called more than once and returns the same each time.
func (p *Process) Kill() error {
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
	return p.killErr
}

// Stderr is the end of what the process wrote to stderr, on one line, for error messages: a
// panic and the lines after it, or else the last lines; JSON log lines are shown by their
// level and message.
func (p *Process) Stderr() string { return p.stderr.String() }

// Checksum is the hex SHA-256 of the binary: the pin when there is one, else what the file
// that was run holds now.
func (p *Process) Checksum() (string, error) {
	if p.opts.SHA256 != nil {
		return hex.EncodeToString(p.opts.SHA256), nil
	}
	return FileSHA256(p.cmd.Path)
}

// FileSHA256 is the hex SHA-256 of a file: what a PATH@sha256:HEX pin names.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
