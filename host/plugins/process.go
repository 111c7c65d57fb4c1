package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/kds-host/kds-host/shared"
)

// ErrNotAPlugin is the error (wrapped) for a binary that is not a kds-host plugin: it does not
// complete the go-plugin handshake with kds-host's cookie and protocol, or serves neither kind.
var ErrNotAPlugin = errors.New("not a kds-host plugin")

// ChecksumError is a binary whose SHA-256 is not the one pinned with PATH@sha256:HEX.
type ChecksumError struct {
	Path             string
	Expected, Actual string // hex
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("plugin %s: checksum mismatch: expected sha256:%s, actual sha256:%s (the binary changed, or the pin is wrong)",
		e.Path, e.Expected, e.Actual)
}

// process is one plugin process as a supervisor sees it: *goProcess, or a fake in tests.
type process interface {
	// Exited reports whether the process has ended.
	Exited() bool
	// Kill ends the process: gracefully, then with SIGKILL after the kill timeout. It returns
	// when the process is gone, and may be called more than once.
	Kill()
	// Stderr is the end of what the process wrote to stderr, for error messages.
	Stderr() string
}

// goProcess is a plugin process run by a go-plugin Client. Its keeper goroutine starts it (on
// an OS thread pinned for the process's lifetime, see pinThread) and kills it on Kill.
type goProcess struct {
	client       *goplugin.Client
	sigkill      context.CancelFunc // cancels the exec context: exec's Cmd.Cancel sends SIGKILL
	stderr       *tail
	killTimeout  time.Duration
	startTimeout time.Duration
	log          hclog.Logger
	path         string // as given
	file         string // the file run, after a $PATH lookup
	pid          int    // set by the keeper before it reports the start

	stopOnce sync.Once
	stop     chan struct{} // closed by Kill
	done     chan struct{} // closed by the keeper when the process is gone
}

// startProcess starts the plugin binary of spec and completes the go-plugin handshake (gRPC,
// AutoMTLS, the kds-host cookie, the checksum pin). It fails within the start timeout.
func startProcess(ctx context.Context, spec Spec, opt *Config, log hclog.Logger) (*goProcess, error) {
	execCtx, sigkill := context.WithCancel(context.Background())
	cmd := exec.CommandContext(execCtx, spec.Path)
	if cmd.Err != nil {
		sigkill()
		return nil, fmt.Errorf("plugin %s: %w", spec.Path, cmd.Err)
	}
	setProcAttr(cmd)
	p := &goProcess{
		sigkill: sigkill, stderr: &tail{}, killTimeout: opt.KillTimeout, startTimeout: opt.StartTimeout,
		log: log, path: spec.Path, file: cmd.Path,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	cc := shared.ClientConfig(cmd, log)
	cc.StartTimeout = opt.StartTimeout
	cc.Stderr = p.stderr
	if spec.SHA256 != nil {
		cc.SecureConfig = &goplugin.SecureConfig{Checksum: spec.SHA256, Hash: sha256.New()}
	}
	p.client = goplugin.NewClient(cc)

	started := make(chan error, 1)
	go p.keep(started)
	var err error
	select {
	case err = <-started:
	case <-ctx.Done():
		sigkill()
		<-started
		err = ctx.Err() // whatever go-plugin says, the start was called off
	}
	if err != nil {
		p.Kill()
		return nil, p.startError(spec, err)
	}
	return p, nil
}

// startError explains why a start failed.
func (p *goProcess) startError(spec Spec, err error) error {
	var pathErr *fs.PathError
	switch {
	case errors.Is(err, goplugin.ErrChecksumsDoNotMatch):
		actual, herr := fileSHA256(p.file)
		if herr != nil {
			actual = "unknown (" + herr.Error() + ")"
		}
		return &ChecksumError{Path: spec.Path, Expected: hex.EncodeToString(spec.SHA256), Actual: actual}
	case errors.As(err, &pathErr), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("plugin %s: %w", spec.Path, err)
	}
	// Everything else is the handshake failing: the program printed something else, said
	// nothing within the start timeout, exited (another cookie), or speaks another version.
	msg, _, _ := strings.Cut(err.Error(), "\n")
	const unrecognized = "Unrecognized remote plugin message: "
	switch {
	case msg == unrecognized+"", msg == "plugin exited before we could connect":
		msg = "it exited without a handshake"
	case strings.HasPrefix(msg, unrecognized):
		msg = fmt.Sprintf("it printed %q instead of a handshake", strings.TrimPrefix(msg, unrecognized))
	case msg == "timeout while waiting for plugin to start":
		msg = fmt.Sprintf("no handshake within the start timeout (%s)", p.startTimeout)
	}
	if s := p.Stderr(); s != "" {
		msg += "; its stderr: " + s
	}
	return fmt.Errorf("plugin %s: %w (it must answer the go-plugin handshake with kds-host's cookie and protocol version %d): %s",
		spec.Path, ErrNotAPlugin, shared.ProtocolVersion, msg)
}

// keep owns the process: it starts it, reports the start, waits for Kill, and kills it. It stays
// on one OS thread for all that time so that Pdeathsig (which Linux ties to the thread that
// forked) fires only when the host dies.
func (p *goProcess) keep(started chan<- error) {
	pinThread()
	defer close(p.done)
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
	p.killBounded()
}

// killBounded runs go-plugin's Kill, which asks the plugin to exit and can hang (a stopped
// process never answers), and SIGKILLs the process if it is not gone within the kill timeout.
func (p *goProcess) killBounded() {
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		p.client.Kill()
	}()
	timer := time.NewTimer(p.killTimeout)
	defer timer.Stop()
	select {
	case <-killed:
		return
	case <-timer.C:
	}
	p.log.Warn("plugin did not exit in time: SIGKILL", "path", p.path, "pid", p.pid, "timeout", p.killTimeout)
	p.sigkill()
	timer.Reset(p.killTimeout)
	select {
	case <-killed:
	case <-timer.C:
		// Only a process stuck in the kernel, or descendants that left its process group and
		// hold its stdout open, get here; go-plugin's Kill returns once they are gone.
		p.log.Error("plugin still not gone after SIGKILL", "path", p.path, "pid", p.pid)
	}
}

func (p *goProcess) Exited() bool { return p.client.Exited() }

func (p *goProcess) Kill() {
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
}

func (p *goProcess) Stderr() string { return p.stderr.String() }

// fileSHA256 is the hex SHA-256 of a file.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// tail keeps the end of a plugin's stderr.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailSize = 4 << 10

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > tailSize {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailSize:]...)
	}
	return len(b), nil
}

// String returns the last lines (at most 3) on one line, JSON log lines shown by their message.
func (t *tail) String() string {
	t.mu.Lock()
	text := string(t.buf)
	t.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		var entry struct {
			Level   string `json:"@level"`
			Message string `json:"@message"`
			Error   string `json:"error"`
		}
		if json.Unmarshal([]byte(l), &entry) == nil && entry.Message != "" {
			l = entry.Level + ": " + entry.Message
			if entry.Error != "" {
				l += ": " + entry.Error
			}
		}
		lines = append(lines, l)
	}
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.Join(lines, " | ")
}
