package guard

import (
	"context"
	"time"

	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/policy"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// withinDeadline is a retry policy whose Schedule calls are given up at timeout even when it
// ignores its context (policy.Within): at most policy.MaxAbandoned of them run on, counted in
// abandoned, and a call made while that many do fails at once, so that the fallback decides. The
// owner check's calls are bounded the same way (checkOwnersLocked).
type withinDeadline struct {
	shared.RetryForcer
	abandoned *policy.Abandoned
	timeout   time.Duration
}

func (w withinDeadline) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	return policy.Within(ctx, w.abandoned, w.timeout, func(ctx context.Context) (*pluginv1.ScheduleResponse, error) {
		return w.RetryForcer.Schedule(ctx, req)
	})
}

// boundedPolicies are opts' retry policy and fallback, each bounded by withinDeadline with its
// own count of calls abandoned; nil stays nil (the built-in policy, in-process, answers at once).
func (g *Guard) boundedPolicies(opts Options) (current func() shared.RetryForcer, fallback shared.RetryForcer) {
	timeout := opts.PolicyTimeout
	if timeout <= 0 {
		timeout = retry.DefaultTimeout
	}
	if opts.Fallback != nil {
		fallback = withinDeadline{opts.Fallback, &g.fallbackAbandoned, timeout}
	}
	if opts.RetryPolicy != nil {
		current = func() shared.RetryForcer { return withinDeadline{opts.RetryPolicy(), &g.retryAbandoned, timeout} }
	}
	return current, fallback
}
