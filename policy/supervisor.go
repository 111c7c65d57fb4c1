package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// exitPoll is how often a supervisor asks go-plugin whether its process has exited. A call that
// finds the plugin unreachable makes it look at once.
const exitPoll = 20 * time.Millisecond

// States of a plugin, as Status.State spells them.
const (
	// StateRunning: a process answers calls.
	StateRunning = "running"
	// StateRestarting: the process exited or hung; a new one is on its way (with backoff).
	// Calls fail at once meanwhile, and the callers fall back: the retry scheduler to the
	// built-in policy, the owner holds open.
	StateRestarting = "restarting"
	// StateStopped: the runtime was closed, or a reload replaced the plugin.
	StateStopped = "stopped"
	// StateBuiltin: the in-process reference plugins.
	StateBuiltin = "builtin"
)

// supervisor keeps one plugin binary running: it routes calls to the current process, notices
// when that process exits or hangs, and starts a new one with backoff (a go-plugin Client cannot
// be restarted, so each start is a new Client). Its goroutine is started by begin and stopped by
// stop.
type supervisor struct {
	spec    Spec
	name    string
	start   func(context.Context) (*instance, error)
	opt     *Options
	log     *slog.Logger
	metrics *metrics
	stats   callStats
	wake    chan struct{} // a call saw trouble: look at the process now

	mu        sync.Mutex // guards the fields below
	cur       *instance  // nil while down
	info      *instance  // the latest instance, for status
	state     string
	since     time.Time
	restarts  int
	lastErr   string
	lastErrAt time.Time
	timeouts  int // timeouts in a row
	failures  int // starts since the plugin last ran stably: the backoff exponent

	cancel   context.CancelFunc
	done     chan struct{}
	retiring sync.WaitGroup // instances being stopped
}

func newSupervisor(spec Spec, first *instance, start func(context.Context) (*instance, error), opt *Options, log *slog.Logger, m *metrics) *supervisor {
	m.started(first.name)
	return &supervisor{
		spec: spec, name: first.name, start: start, opt: opt, log: log, metrics: m,
		wake: make(chan struct{}, 1), cur: first, info: first, state: StateRunning, since: time.Now(),
	}
}

// begin starts supervising.
func (s *supervisor) begin() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	go s.run(ctx)
}

// stop ends supervision: the running process gets the calls in flight done (up to a call
// timeout), then is killed. It returns when every process is gone.
func (s *supervisor) stop() {
	s.cancel()
	<-s.done
	s.retiring.Wait()
}

func (s *supervisor) run(ctx context.Context) {
	defer close(s.done)
	s.mu.Lock()
	inst := s.cur
	s.mu.Unlock()
	for {
		stopped := s.watch(ctx, inst)
		drain := time.Duration(0)
		if stopped {
			drain = s.opt.CallTimeout
		}
		s.retiring.Add(1)
		go func(inst *instance) {
			defer s.retiring.Done()
			inst.retire(drain)
		}(inst)
		if stopped {
			return
		}
		if inst = s.restart(ctx, time.Since(inst.started)); inst == nil {
			s.mu.Lock()
			s.state, s.since = StateStopped, time.Now()
			s.mu.Unlock()
			return
		}
	}
}

// watch returns when inst is out of service: it exited, it hung (the call path took it out), or
// supervision stops (then stopped is true).
func (s *supervisor) watch(ctx context.Context, inst *instance) (stopped bool) {
	poll := time.NewTicker(exitPoll)
	defer poll.Stop()
	probe := time.NewTicker(s.opt.ProbeInterval)
	defer probe.Stop()
	for {
		if inst.proc.Exited() {
			reason := "the plugin process exited"
			if tail := inst.proc.Stderr(); tail != "" {
				reason += "; its stderr: " + tail
			}
			s.takeOut(inst, reason)
		}
		if !s.isCurrent(inst) {
			return false
		}
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.cur, s.state, s.since = nil, StateStopped, time.Now()
			s.mu.Unlock()
			return true
		case <-poll.C:
		case <-s.wake:
		case <-probe.C:
			// Describe is a health probe: a hung plugin is found even when no call comes.
			_, _, _ = s.invoke(ctx, "Describe (health probe)", inst, func(ctx context.Context, i *instance) error {
				if i.rf != nil {
					_, err := i.rf.Describe(ctx)
					return err
				}
				_, err := i.oc.Describe(ctx)
				return err
			})
		}
	}
}

func (s *supervisor) isCurrent(inst *instance) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur == inst
}

// takeOut puts inst out of service when it is the current one: calls fail at once until a new
// process is up, and their callers fall back.
func (s *supervisor) takeOut(inst *instance, reason string) {
	s.mu.Lock()
	if s.cur != inst {
		s.mu.Unlock()
		return
	}
	s.cur, s.state, s.since, s.lastErr, s.lastErrAt, s.timeouts = nil, StateRestarting, time.Now(), reason, time.Now(), 0
	s.mu.Unlock()
	s.log.Warn("plugin out of service until a new process is up; its callers fall back meanwhile",
		"plugin", s.name, "pid", inst.pid, "reason", reason)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// backoff returns the delay before the next start: BackoffMin, doubled per start since the
// plugin last ran for StableAfter, up to BackoffMax.
func (s *supervisor) backoff() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.opt.BackoffMin
	for range s.failures {
		if d >= s.opt.BackoffMax {
			break
		}
		d *= 2
	}
	s.failures++
	return min(d, s.opt.BackoffMax)
}

// restart starts a new process, with backoff, until one comes up or ctx ends (then nil).
func (s *supervisor) restart(ctx context.Context, uptime time.Duration) *instance {
	if uptime >= s.opt.StableAfter {
		s.mu.Lock()
		s.failures = 0
		s.mu.Unlock()
	}
	for {
		delay := s.backoff()
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		inst, err := s.start(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.mu.Lock()
			s.lastErr, s.lastErrAt = err.Error(), time.Now()
			s.mu.Unlock()
			s.log.Error("plugin restart failed", "plugin", s.name, "error", err)
			continue
		}
		s.mu.Lock()
		s.cur, s.info, s.state, s.since, s.timeouts = inst, inst, StateRunning, time.Now(), 0
		s.restarts++
		s.mu.Unlock()
		s.metrics.restarts.WithLabelValues(s.name).Inc()
		s.log.Info("plugin restarted", "plugin", s.name, "pid", inst.pid, "after", delay)
		return inst
	}
}

// downError is the answer of a call while the plugin is out of service.
type downError struct {
	plugin, reason string
}

func (e *downError) Error() string {
	return fmt.Sprintf("plugin %s is down (%s); it is being restarted", e.plugin, e.reason)
}

// GRPCStatus makes the error Unavailable for status.Code.
func (e *downError) GRPCStatus() *status.Status { return status.New(codes.Unavailable, e.Error()) }

// call runs f on the current process, with the call deadline, and counts it. While the plugin
// is down it fails at once with a *downError.
func (s *supervisor) call(ctx context.Context, method string, f func(context.Context, *instance) error) error {
	s.mu.Lock()
	inst := s.cur
	reason := s.lastErr
	s.mu.Unlock()
	if inst == nil || !inst.acquire() {
		if reason == "" {
			reason = "stopped"
		}
		s.record(method, 0, true, false)
		return &downError{plugin: s.name, reason: reason}
	}
	defer inst.release()
	d, timedOut, err := s.invoke(ctx, method, inst, f)
	s.record(method, d, err != nil, timedOut)
	return err
}

// invoke runs f on inst with the call deadline, keeps a failure as the last error, and keeps the
// count of timeouts in a row: at HungAfter the plugin is hung, and is taken out of service to be
// replaced.
func (s *supervisor) invoke(ctx context.Context, method string, inst *instance, f func(context.Context, *instance) error) (d time.Duration, timedOut bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, s.opt.CallTimeout)
	start := time.Now()
	err = f(cctx, inst)
	d = time.Since(start)
	cancel()
	timedOut = err != nil && (status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded))
	var hung bool
	s.mu.Lock()
	if err != nil && !errors.Is(ctx.Err(), context.Canceled) && s.cur == inst {
		s.lastErr, s.lastErrAt = method+": "+err.Error(), time.Now()
	}
	switch {
	case err == nil:
		s.timeouts = 0
	case timedOut && s.cur == inst:
		s.timeouts++
		hung = s.timeouts >= s.opt.HungAfter
	}
	n := s.timeouts
	s.mu.Unlock()
	switch {
	case hung:
		s.takeOut(inst, fmt.Sprintf("hung: %d calls in a row missed their %s deadline", n, s.opt.CallTimeout))
	case status.Code(err) == codes.Unavailable:
		// Most likely the process is gone: look now rather than at the next poll.
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	return d, timedOut, err
}

func (s *supervisor) record(method string, d time.Duration, failed, timedOut bool) {
	s.stats.record(d, failed, timedOut)
	s.metrics.call(s.name, method, d, failed, timedOut)
}

func (s *supervisor) status() Status {
	s.mu.Lock()
	st := Status{
		Name: s.name, Path: s.spec.Path, Checksum: "sha256:" + s.info.checksum, Version: s.info.version, Env: envNames(s.opt, s.spec),
		Serves: s.info.serves(), Policy: s.info.policy, State: s.state, Since: s.since,
		Restarts: s.restarts, LastError: s.lastErr,
	}
	if !s.lastErrAt.IsZero() {
		at := s.lastErrAt
		st.LastErrorAt = &at
	}
	if s.info.checksum == "" {
		st.Checksum = ""
	}
	if s.cur != nil {
		st.PID = s.cur.pid
	}
	s.mu.Unlock()
	s.stats.fill(&st)
	return st
}
