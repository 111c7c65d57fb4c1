package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/launch"
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
	s := &suite{opts: opts, parent: ctx, budget: budget}
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

	// proc is the plugin process under check, from the handshake on.
	proc *launch.Process
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
	// handshakeFailed: the host could not talk to the plugin; even the kill check is not run.
	handshakeFailed bool
	// failed is the first check that failed: one fault is one failed check, and the checks
	// after it are not run (the kill check excepted).
	failed string
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
		if s.failed != "" {
			res.NotRun, res.Detail = true, fmt.Sprintf("%s failed first; fix that and run again (one fault fails one check)", s.failed)
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
	c.g = gomega.NewGomega(func(message string, _ ...int) { panic(checkFailure{plainMessage(message)}) })

	defer func() {
		switch r := recover().(type) {
		case nil:
			res.Passed = true
			res.Detail = strings.Join(c.notes, "\n")
		case checkFailure:
			res.Detail = r.msg
			if s.failed == "" && !ch.always {
				s.failed = ch.name
			}
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

// plainMessage turns a gomega failure into one line a plugin author reads: the description,
// then "expected X to be > Y", without gomega's type annotations and object dumps.
func plainMessage(msg string) string {
	desc, rest, found := strings.Cut(msg, "Expected")
	if !found {
		return strings.TrimSpace(msg)
	}
	desc = strings.TrimRight(strings.TrimSpace(desc), ":")
	var parts []string
	for _, line := range strings.Split(rest, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "{") {
			continue
		}
		if strings.HasPrefix(line, "<") {
			if i := strings.Index(line, ">: "); i >= 0 {
				line = line[i+3:]
			} else if strings.HasSuffix(line, ">:") {
				continue
			}
		}
		parts = append(parts, line)
	}
	expected := "expected " + strings.Join(parts, " ")
	if desc == "" {
		return expected
	}
	return desc + ": " + expected
}

// start launches the plugin binary as the host does (launch.Start), offering the given protocol
// versions (nil: the host's), and connects to it. The process leads a process group of its own;
// what is left in it at the end of the run is killed.
func (s *suite) start(ctx context.Context, versions map[int]plugin.PluginSet) (*launch.Process, plugin.ClientProtocol, error) {
	p, err := launch.Start(ctx, launch.Options{
		Path: s.opts.Path, Plugins: versions, Logger: s.opts.Logger,
		StartTimeout: s.opts.StartTimeout, KillTimeout: killTimeout,
	})
	if err != nil {
		return nil, nil, err
	}
	s.groups = append(s.groups, p.Pid())
	rpc, err := p.Client().Client()
	if err != nil {
		_ = p.Kill()
		return nil, nil, fmt.Errorf("connect to the plugin: %w", err)
	}
	return p, rpc, nil
}

// cleanup kills the plugin when the kill check did not, and whatever the run's plugin processes
// left behind.
func (s *suite) cleanup() {
	if s.proc != nil && !s.killed {
		kids, _ := descendants(s.proc.Pid())
		_ = s.proc.Kill() // bounded: the launcher SIGKILLs the process group after killTimeout
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
		c.failf("%s: the plugin process exited during the call (%v)%s", what, err, c.stderrExcerpt())
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
	if s.proc == nil {
		return false
	}
	tries := 1
	if status.Code(err) == codes.Unavailable {
		tries = 20
	}
	for i := range tries {
		if s.proc.Exited() || exited(s.proc.Pid()) {
			return true
		}
		if i < tries-1 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return false
}

// concurrently makes Concurrency calls fn(0) ... fn(Concurrency-1) at once and returns their
// answers in that order. A call that failed fails the check.
func concurrently[T any](c *checkRun, op string, fn func(i int) (T, error)) []T {
	answers := make([]T, Concurrency)
	errs := make([]error, Concurrency)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i], errs[i] = fn(i) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	for i, err := range errs {
		if err != nil {
			c.callFailed(fmt.Sprintf("concurrent %s call %d of %d", op, i+1, Concurrency), err)
		}
	}
	c.notef("%d calls in flight at once, all answered in %s", Concurrency, round(elapsed))
	return answers
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

// stderrExcerpt is the end of the plugin's stderr, as a line to append to a report's detail.
func (s *suite) stderrExcerpt() string {
	if s.proc == nil || s.proc.Stderr() == "" {
		return ""
	}
	return "\nplugin stderr: " + s.proc.Stderr()
}
