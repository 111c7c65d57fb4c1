package retry

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/internal/within"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// DefaultTimeout is the deadline of a retry policy call unless configured otherwise.
const DefaultTimeout = 200 * time.Millisecond

// Decorators wrap a RetryForcer and are RetryForcers themselves, so policy concerns compose
// (as client-go's rate limiters do): Standard builds the chain the host runs.

// StandardConfig is how Standard bounds the policies it runs. Zero fields are defaults.
type StandardConfig struct {
	// Timeout is the deadline of each Schedule call (default DefaultTimeout).
	Timeout time.Duration
	// Bounds are what the server accepts of an answer, its maximum delay included (zero fields:
	// shared's defaults).
	Bounds shared.Bounds
	// OnFallback, if set, hears of each decision the built-in policy made instead, and why.
	OnFallback func(req *pluginv1.ScheduleRequest, err error)
}

// Standard is the policy a Scheduler runs: the policy in force now (current is asked at every
// decision, so a swap takes effect at the next one), its answers checked against cfg.Bounds and
// its calls bounded by cfg.Timeout, and on any failure the built-in policy, checked and bounded
// the same way.
func Standard(current func() shared.RetryForcer, builtin shared.RetryForcer, cfg StandardConfig) shared.RetryForcer {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	return toldMaxDelay{WithFallback(WithDeadline(Checked(Current(current), cfg.Bounds), cfg.Timeout),
		WithDeadline(Checked(builtin, cfg.Bounds), cfg.Timeout), cfg.OnFallback), cfg.Bounds.WithDefaults().MaxDelay}
}

// toldMaxDelay sets every request's max_delay to the host's maximum, so that the policy, and
// the fallback after it, can cap its delay there instead of being refused. It sets the field in
// place, before any call: the request is the caller's to build, and no one else reads it yet.
type toldMaxDelay struct {
	shared.RetryForcer
	max time.Duration
}

func (t toldMaxDelay) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	if req != nil {
		req.MaxDelay = durationpb.New(t.max)
	}
	return t.RetryForcer.Schedule(ctx, req)
}

// decorator forwards Describe and Configure to the policy it wraps; each decorator replaces
// Schedule.
type decorator struct{ shared.RetryForcer }

// Current is the policy that current returns at each call.
func Current(current func() shared.RetryForcer) shared.RetryForcer { return currentPolicy(current) }

type currentPolicy func() shared.RetryForcer

func (c currentPolicy) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	return c().Describe(ctx)
}

func (c currentPolicy) Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return c().Configure(ctx, req)
}

func (c currentPolicy) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	return c().Schedule(ctx, req)
}

// WithDeadline bounds every Schedule call of p by timeout. It returns by the deadline even when
// p ignores its context: the call then goes on in its own goroutine, whose context is canceled,
// until p returns, and its answer is dropped. Nothing waits for such a call, and while
// within.MaxAbandoned of them run on, a call fails at once (the fallback decides).
func WithDeadline(p shared.RetryForcer, timeout time.Duration) shared.RetryForcer {
	return &deadline{decorator: decorator{p}, timeout: timeout}
}

type deadline struct {
	decorator
	timeout   time.Duration
	abandoned within.Abandoned
}

func (d *deadline) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	resp, err := within.Do(ctx, &d.abandoned, d.timeout, func(ctx context.Context) (*pluginv1.ScheduleResponse, error) {
		resp, err := d.RetryForcer.Schedule(ctx, req)
		if err != nil {
			return nil, policyError{err}
		}
		return resp, nil
	})
	var own policyError
	switch {
	case errors.As(err, &own):
		return nil, own.error // the policy's own error, as it gave it
	case err != nil:
		return nil, fmt.Errorf("retry policy: %w", err) // not answered by the deadline
	}
	return resp, nil
}

// policyError is an error the policy itself answered with.
type policyError struct{ error }

func (e policyError) Unwrap() error { return e.error }

// Checked turns an answer the host must not act on into an error: none, or one outside bounds
// (shared.Bounds.CheckSchedule: a delay that is not positive or over MaxDelay, a reason too
// long, type URLs or hold names the request did not carry). The error is a *shared.BoundsError.
func Checked(p shared.RetryForcer, bounds shared.Bounds) shared.RetryForcer {
	return &checked{decorator{p}, bounds.WithDefaults()}
}

type checked struct {
	decorator
	bounds shared.Bounds
}

func (c *checked) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	resp, err := c.RetryForcer.Schedule(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := c.bounds.CheckSchedule(req, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// WithFallback answers with fallback whenever p fails. onFallback, if set, is told why.
func WithFallback(p, fallback shared.RetryForcer, onFallback func(req *pluginv1.ScheduleRequest, err error)) shared.RetryForcer {
	return &withFallback{decorator{p}, fallback, onFallback}
}

type withFallback struct {
	decorator
	fallback   shared.RetryForcer
	onFallback func(*pluginv1.ScheduleRequest, error)
}

func (f *withFallback) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	resp, err := f.RetryForcer.Schedule(ctx, req)
	if err == nil || ctx.Err() != nil {
		return resp, err
	}
	if f.onFallback != nil {
		f.onFallback(req, err)
	}
	resp, ferr := f.fallback.Schedule(ctx, req)
	if ferr != nil {
		return nil, fmt.Errorf("%w; the fallback failed too: %w", err, ferr)
	}
	// The reason says who decided, and why the policy in force did not: insights show it.
	out := proto.Clone(resp).(*pluginv1.ScheduleResponse)
	out.Reason = fmt.Sprintf("built-in fallback (%s): %s", truncateText(err.Error(), fallbackErrText), resp.GetReason())
	return out, nil
}

// fallbackErrText is how much of the policy's error a fallback decision's reason quotes.
const fallbackErrText = 200

// truncateText cuts s to at most n bytes on a rune boundary, marking the cut.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
