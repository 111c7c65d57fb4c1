package conformance

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// checkTimeout bounds one check; each call in it is bounded by Options.CallTimeout as well.
const checkTimeout = 10 * time.Second

// killTimeout bounds the kill check, over MaxExitAfterKill, for a Kill that never returns.
const killTimeout = 5 * time.Second

// Run starts the plugin at opts.Path, runs every check that applies to what it serves, kills it,
// and reports. It returns in bounded time whatever the plugin does: each call has a deadline,
// checks after a hung or dead plugin are reported as not run, and the kill check always runs.
func Run(ctx context.Context, opts Options) Report {
	opts = opts.withDefaults()
	start := time.Now()
	budget, cancel := context.WithTimeout(ctx, opts.Budget)
	defer cancel()
	s := &suite{opts: opts, parent: ctx, budget: budget, stderr: &tail{}}
	defer s.cleanup()

	report := Report{Plugin: opts.Path}
	report.Checks = append(report.Checks, s.run(handshakeCheck))
	for _, ch := range s.plan() {
		report.Checks = append(report.Checks, s.run(ch))
	}
	report.Kinds = s.kinds
	if d := s.firstDescribe(); d != nil {
		report.Name, report.Version = d.GetName(), d.GetVersion()
	}
	report.Duration = time.Since(start)
	return report
}

// check is one rule a plugin must keep.
type check struct {
	name    string
	summary string
	run     func(c *checkRun)
	// always runs the check even after the plugin stopped answering (the kill check).
	always bool
}

// suite is one run against one plugin process.
type suite struct {
	opts   Options
	parent context.Context
	budget context.Context
	stderr *tail
	// forcedKill is set when go-plugin had to SIGKILL the plugin process under check after
	// asking it to exit.
	forcedKill atomic.Bool

	client *plugin.Client
	pid    int
	// groups are the process groups of every plugin process the run started; what is left in
	// them at the end is killed.
	groups []int
	kinds  []string
	rf     shared.RetryForcer
	oc     shared.OwnerCheck
	rfDesc *pluginv1.DescribeResponse
	ocDesc *pluginv1.DescribeResponse

	// config is the RetryForcer policy document the checks run under; maxDelay is the declared
	// maximum under it.
	config   []byte
	maxDelay time.Duration

	// broken says why the plugin cannot be checked any further; empty while it answers.
	broken string
	// current is the name of the check that is running.
	current string
	killed  bool
}

// plan lists the checks after the handshake, for the kinds the plugin serves.
func (s *suite) plan() []check {
	plan := []check{versionNegotiationCheck, describeCheck}
	if slices.Contains(s.kinds, KindRetryForcer) {
		plan = append(plan, retryForcerChecks...)
	}
	if slices.Contains(s.kinds, KindOwnerCheck) {
		plan = append(plan, ownerCheckChecks...)
	}
	return append(plan, killCheck)
}

// firstDescribe is the Describe answer that names the plugin in the report.
func (s *suite) firstDescribe() *pluginv1.DescribeResponse {
	if s.rfDesc != nil {
		return s.rfDesc
	}
	return s.ocDesc
}

// checkRun is one check running: its deadline, its gomega, and what it noted.
type checkRun struct {
	*suite
	ctx   context.Context
	g     gomega.Gomega
	notes []string
}

// checkFailure, checkSkip and checkNotRun end a check early; run recovers them.
type (
	checkFailure struct{ msg string }
	checkSkip    struct{ reason string }
	checkNotRun  struct{ reason string }
)

// failf ends the check as failed.
func (c *checkRun) failf(format string, args ...any) {
	panic(checkFailure{fmt.Sprintf(format, args...)})
}

// skipf ends the check as skipped: it does not apply, and the report does not fail for it.
func (c *checkRun) skipf(format string, args ...any) {
	panic(checkSkip{fmt.Sprintf(format, args...)})
}

// notRunf ends the check as failed because it could not run.
func (c *checkRun) notRunf(format string, args ...any) {
	panic(checkNotRun{fmt.Sprintf(format, args...)})
}

// notef records what a passing check measured, for the report.
func (c *checkRun) notef(format string, args ...any) {
	c.notes = append(c.notes, fmt.Sprintf(format, args...))
}

// run runs one check with its own deadline and turns its outcome into a result.
func (s *suite) run(ch check) (res CheckResult) {
	res = CheckResult{Name: ch.name, Summary: ch.summary}
	start := time.Now()
	defer func() { res.Duration = time.Since(start) }()
	if !ch.always {
		if s.broken != "" {
			res.NotRun, res.Detail = true, s.broken
			return res
		}
		if s.budget.Err() != nil {
			res.NotRun, res.Detail = true, fmt.Sprintf("the run's budget of %s is spent (%v)", s.opts.Budget, context.Cause(s.budget))
			return res
		}
	}
	parent := s.budget
	if ch.always {
		parent = context.WithoutCancel(s.parent)
	}
	ctx, cancel := context.WithTimeout(parent, checkTimeout)
	defer cancel()
	s.current = ch.name
	c := &checkRun{suite: s, ctx: ctx}
	c.g = gomega.NewGomega(func(message string, _ ...int) { panic(checkFailure{message}) })

	defer func() {
		switch r := recover().(type) {
		case nil:
			res.Passed = true
			res.Detail = strings.Join(c.notes, "\n")
		case checkFailure:
			res.Detail = r.msg
		case checkSkip:
			res.Skipped = true
			res.Detail = r.reason
		case checkNotRun:
			res.NotRun = true
			res.Detail = r.reason
		default:
			res.Detail = fmt.Sprintf("the conformance suite itself failed (please report it): %v", r)
		}
	}()
	ch.run(c)
	return res
}

// instance is a plugin process started through go-plugin.
type instance struct {
	client *plugin.Client
	rpc    plugin.ClientProtocol
	pid    int
}

// start launches the plugin binary with the kds-host client configuration, offering the given
// protocol versions, and waits for the handshake. The process runs in a process group of its
// own, which the run cleans up at its end.
func (s *suite) start(versions map[int]plugin.PluginSet, logger hclog.Logger) (instance, error) {
	cmd := exec.Command(s.opts.Path)
	ownProcessGroup(cmd)
	cfg := shared.ClientConfig(cmd, logger)
	cfg.VersionedPlugins = versions
	cfg.StartTimeout = s.opts.StartTimeout
	cfg.Stderr = s.stderr
	client := plugin.NewClient(cfg)
	rpc, err := client.Client()
	if cmd.Process != nil {
		s.groups = append(s.groups, cmd.Process.Pid)
	}
	if err != nil {
		client.Kill()
		return instance{}, err
	}
	return instance{client: client, rpc: rpc, pid: cmd.Process.Pid}, nil
}

// cleanup kills the plugin when the kill check did not, and whatever the run's plugin processes
// left behind.
func (s *suite) cleanup() {
	if s.client != nil && !s.killed {
		kids, _ := descendants(s.pid)
		done := make(chan struct{})
		go func() { s.client.Kill(); close(done) }()
		select {
		case <-done:
		case <-time.After(killTimeout):
			killAll(append(kids, s.pid))
			<-done
		}
		killAll(running(kids))
	}
	for _, g := range s.groups {
		killAll(groupMembers(g))
	}
}

// timeoutError is a call that did not return before its deadline.
type timeoutError struct {
	op      string
	timeout time.Duration
	err     error
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("%s did not answer within %s", e.op, e.timeout)
}

func (e *timeoutError) Unwrap() error { return e.err }

// call runs one call to the plugin with the call deadline; an error from a call that ran out of
// time is a *timeoutError.
func call[T any](c *checkRun, op string, fn func(ctx context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.CallTimeout)
	defer cancel()
	start := time.Now()
	resp, err := fn(ctx)
	// The plugin's side of the deadline may fire a moment before this side's.
	late := status.Code(err) == codes.DeadlineExceeded && time.Since(start) >= c.opts.CallTimeout*9/10
	if err != nil && (ctx.Err() != nil || late) {
		timeout := c.opts.CallTimeout
		if dl, ok := c.ctx.Deadline(); ok && time.Until(dl) <= 0 {
			op += " (the check's own deadline passed)"
		}
		err = &timeoutError{op: op, timeout: timeout, err: err}
	}
	return resp, err
}

// callFailed ends the check for a call that failed where it must not. A call that hung or a
// plugin that died also ends the run: the checks after this one are not run.
func (c *checkRun) callFailed(what string, err error) {
	var te *timeoutError
	if errors.As(err, &te) {
		c.broken = fmt.Sprintf("the plugin stopped answering in %s", c.current)
		c.failf("%s: %s did not answer within %s. The host gives a plugin call 200 ms by default; a plugin must answer, or honour the call's context, and never block.",
			what, te.op, te.timeout)
	}
	if c.processExited(err) {
		c.broken = fmt.Sprintf("the plugin process exited during %s", c.current)
		c.failf("%s: the plugin process exited during the call (%v)%s", what, err, c.stderr.excerpt())
	}
	st := status.Convert(err)
	if st.Code() == codes.Internal && strings.Contains(st.Message(), "panicked") {
		c.failf("%s: the plugin panicked: %s. A plugin never panics: answer bad input with InvalidArgument (shared.InvalidArgument).", what, st.Message())
	}
	c.failf("%s: %v", what, err)
}

// processExited reports whether the plugin process has exited. After a call that lost its
// connection (Unavailable) it gives go-plugin a moment to notice an exit that has just happened.
func (s *suite) processExited(err error) bool {
	if s.client == nil {
		return false
	}
	tries := 1
	if status.Code(err) == codes.Unavailable {
		tries = 20
	}
	for i := range tries {
		if s.client.Exited() || exited(s.pid) {
			return true
		}
		if i < tries-1 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return false
}

// alive fails the check unless the plugin still answers Describe after what came before.
func (c *checkRun) alive(after string) {
	var err error
	if c.rf != nil {
		_, err = call(c, "RetryForcer.Describe", c.rf.Describe)
	} else {
		_, err = call(c, "OwnerCheck.Describe", c.oc.Describe)
	}
	if err != nil {
		c.callFailed("Describe after "+after, err)
	}
}

// answeredOrInvalid holds a call with bad or empty input to the rule: answer it, or refuse it
// with InvalidArgument; nothing else (no panic, no crash, no other code). It reports whether
// the call was answered.
func (c *checkRun) answeredOrInvalid(what string, err error) bool {
	if err == nil {
		c.notef("%s: answered", what)
		return true
	}
	var te *timeoutError
	if errors.As(err, &te) || status.Code(err) != codes.InvalidArgument {
		c.callFailed(what+" must be answered or refused with InvalidArgument", err)
	}
	msg := status.Convert(err).Message()
	c.g.Expect(msg).NotTo(gomega.BeEmpty(), "%s: InvalidArgument must say what is wrong", what)
	c.notef("%s: InvalidArgument (%s)", what, msg)
	return false
}

// shutdownWatcher is the go-plugin client's logger: it notes when go-plugin has to force-kill
// the plugin after asking it to exit.
type shutdownWatcher struct {
	hclog.Logger
	forced *atomic.Bool
}

func (w *shutdownWatcher) Warn(msg string, args ...any) {
	if strings.Contains(msg, "failed to exit gracefully") {
		w.forced.Store(true)
	}
	w.Logger.Warn(msg, args...)
}

// tail keeps the end of the plugin's stderr, for the report.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailSize = 16 << 10

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - tailSize; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// excerpt is the part of the plugin's stderr that explains a failure, as lines to append to a
// report's detail: a panic and the line after it, or else the last few lines.
func (t *tail) excerpt() string {
	lines := strings.Split(strings.TrimSpace(t.String()), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return ""
	}
	pick := lines[max(0, len(lines)-3):]
	for i, l := range lines {
		if strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") {
			pick = lines[i:min(len(lines), i+3)]
			break
		}
	}
	return "\nplugin stderr:\n  " + strings.Join(pick, "\n  ")
}
