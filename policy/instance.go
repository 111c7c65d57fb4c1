package policy

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/launch"
)

// Service names, as Status.Serves spells them.
const (
	RetryForcerService = "RetryForcer"
	OwnerCheckService  = "OwnerCheck"
)

// process is one plugin process as a supervisor sees it: a *launch.Process, or a fake in tests.
type process interface {
	// Exited reports whether the process has ended.
	Exited() bool
	// Kill ends the process: gracefully, then with SIGKILL after the kill timeout. It returns
	// when the process is gone, and may be called more than once. Its error says the kill was
	// forced; the launcher has logged it.
	Kill() error
	// Stderr is the end of what the process wrote to stderr, for error messages.
	Stderr() string
}

// instance is one started plugin process and what it serves. Calls hold it (acquire, release)
// so that a swap lets them finish before the process is stopped.
type instance struct {
	proc     process
	pid      int
	started  time.Time
	name     string // from Describe
	version  string
	checksum string // hex SHA-256 of the binary
	policy   string // what Configure said is in force
	rf       shared.RetryForcer
	oc       shared.OwnerCheck

	mu       sync.Mutex // guards inflight and closed
	inflight int
	closed   bool
	idle     chan struct{} // closed once closed and no call is in flight
}

func newInstance(proc process, pid int) *instance {
	return &instance{proc: proc, pid: pid, started: time.Now(), idle: make(chan struct{})}
}

// serves lists the services the instance answers.
func (i *instance) serves() []string {
	var out []string
	if i.rf != nil {
		out = append(out, RetryForcerService)
	}
	if i.oc != nil {
		out = append(out, OwnerCheckService)
	}
	return out
}

// acquire admits a call, unless the instance is closed for calls.
func (i *instance) acquire() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return false
	}
	i.inflight++
	return true
}

func (i *instance) release() {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.inflight--
	if i.closed && i.inflight == 0 {
		close(i.idle)
	}
}

// closeForCalls admits no more calls and returns a channel closed when those in flight are done.
func (i *instance) closeForCalls() <-chan struct{} {
	i.mu.Lock()
	defer i.mu.Unlock()
	if !i.closed {
		i.closed = true
		if i.inflight == 0 {
			close(i.idle)
		}
	}
	return i.idle
}

// retire stops the instance: it waits up to drain for the calls in flight, then kills the
// process (bounded).
func (i *instance) retire(drain time.Duration) {
	idle := i.closeForCalls()
	if drain > 0 {
		t := time.NewTimer(drain)
		select {
		case <-idle:
		case <-t.C:
		}
		t.Stop()
	}
	i.kill()
}

// kill ends the process at once (bounded). How it went does not matter here: a forced kill is
// in the log already.
func (i *instance) kill() { _ = i.proc.Kill() }

// startInstance starts the binary of spec and learns what it serves. A binary serves a kind when
// it answers that kind's Describe; Unimplemented means it does not. go-plugin logs to log, and
// the plugin's lines to log.Named(binary name).
func startInstance(ctx context.Context, spec Spec, opt *Options, log hclog.Logger) (*instance, error) {
	p, err := launch.Start(ctx, launch.Options{
		Path: spec.Path, SHA256: spec.SHA256, PinFolder: spec.PinFolder, CopyDir: opt.CopyDir, Env: envNames(opt, spec), Logger: log,
		StartTimeout: opt.StartTimeout, KillTimeout: opt.KillTimeout,
	})
	if err != nil {
		return nil, err
	}
	inst := newInstance(p, p.Pid())
	// Pinned, the pin; else what runs. go-plugin has run it already, so this is for display.
	inst.checksum, _ = p.Checksum()
	ictx, cancel := context.WithTimeout(ctx, opt.StartTimeout)
	defer cancel()
	if err := inst.identify(ictx, p.Client()); err != nil {
		// A plugin without AutoMTLS fails here, at the first call: say so, and what to do.
		if e := p.Unreachable(ictx, err, opt.CallTimeout); e != nil {
			err = e
		}
		_ = p.Kill()
		return nil, fmt.Errorf("plugin %s: %w", spec.Path, err)
	}
	if inst.name == "" {
		inst.name = filepath.Base(spec.Path)
	}
	return inst, nil
}

// envNames are the host environment variables the plugin of spec sees besides the base ones:
// the runtime's, then the spec's.
func envNames(opt *Options, spec Spec) []string {
	var out []string
	for _, n := range slices.Concat(opt.Env, spec.Env) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// identify dispenses both kinds and keeps those the plugin answers Describe for.
func (i *instance) identify(ctx context.Context, c *goplugin.Client) error {
	rpc, err := c.Client()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	rfRaw, err := rpc.Dispense(shared.RetryForcerName)
	if err != nil {
		return fmt.Errorf("dispense %s: %w", shared.RetryForcerName, err)
	}
	ocRaw, err := rpc.Dispense(shared.OwnerCheckName)
	if err != nil {
		return fmt.Errorf("dispense %s: %w", shared.OwnerCheckName, err)
	}
	rf, oc := rfRaw.(shared.RetryForcer), ocRaw.(shared.OwnerCheck)
	describe := func(service string, f func(context.Context) (*pluginv1.DescribeResponse, error)) (*pluginv1.DescribeResponse, error) {
		d, err := f(ctx)
		if status.Code(err) == codes.Unimplemented {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s.Describe: %w", service, err)
		}
		return d, nil
	}
	rd, err := describe(RetryForcerService, rf.Describe)
	if err != nil {
		return err
	}
	od, err := describe(OwnerCheckService, oc.Describe)
	if err != nil {
		return err
	}
	if rd == nil && od == nil {
		return fmt.Errorf("%w: it serves neither RetryForcer nor OwnerCheck", launch.ErrNotAPlugin)
	}
	if od != nil {
		i.oc, i.name, i.version = oc, od.GetName(), od.GetVersion()
	}
	if rd != nil {
		i.rf, i.name, i.version = rf, rd.GetName(), rd.GetVersion()
	}
	return nil
}

// configure puts doc in force in the instance's RetryForcer.
func (i *instance) configure(ctx context.Context, doc *Document) error {
	if i.rf == nil {
		return fmt.Errorf("plugin %s serves only OwnerCheck, which takes no policy document (%s)", i.name, doc.Source)
	}
	resp, err := i.rf.Configure(ctx, &pluginv1.ConfigureRequest{Document: doc.Data})
	if err != nil {
		return fmt.Errorf("configure plugin %s with %s: %w", i.name, doc.Source, err)
	}
	i.policy = resp.GetPolicy()
	return nil
}
