package plugins

import (
	"context"
	"errors"
	"time"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// retryForwarder is Runtime.RetryForcer: the RetryForcer plugin of the current generation, or
// the built-in policy when there is none.
type retryForwarder struct{ rt *Runtime }

func (f *retryForwarder) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	return forward(f.rt, ctx, "Describe", retrySide, func(ctx context.Context, rf shared.RetryForcer) (*pluginv1.DescribeResponse, error) {
		return rf.Describe(ctx)
	})
}

// Configure reaches the plugin in force now. A restart re-applies the document the plugin was
// loaded with, so lasting changes go through Reload.
func (f *retryForwarder) Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return forward(f.rt, ctx, "Configure", retrySide, func(ctx context.Context, rf shared.RetryForcer) (*pluginv1.ConfigureResponse, error) {
		return rf.Configure(ctx, req)
	})
}

func (f *retryForwarder) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	return forward(f.rt, ctx, "Schedule", retrySide, func(ctx context.Context, rf shared.RetryForcer) (*pluginv1.ScheduleResponse, error) {
		return rf.Schedule(ctx, req)
	})
}

// fallbackForwarder is Runtime.Fallback: always the built-in retry policy.
type fallbackForwarder struct{ rt *Runtime }

func (f *fallbackForwarder) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	b := f.rt.gen.Load().builtin
	return callBuiltin(f.rt, ctx, "Describe", func(ctx context.Context) (*pluginv1.DescribeResponse, error) { return b.rf.Describe(ctx) })
}

func (f *fallbackForwarder) Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	b := f.rt.gen.Load().builtin
	return callBuiltin(f.rt, ctx, "Configure", func(ctx context.Context) (*pluginv1.ConfigureResponse, error) { return b.rf.Configure(ctx, req) })
}

func (f *fallbackForwarder) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	b := f.rt.gen.Load().builtin
	return callBuiltin(f.rt, ctx, "Schedule", func(ctx context.Context) (*pluginv1.ScheduleResponse, error) { return b.rf.Schedule(ctx, req) })
}

// ownerForwarder is Runtime.OwnerCheck: the OwnerCheck plugin of the current generation, or the
// built-in owner check when there is none.
type ownerForwarder struct{ rt *Runtime }

func (f *ownerForwarder) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	return forward(f.rt, ctx, "Describe", ownerSide, func(ctx context.Context, oc shared.OwnerCheck) (*pluginv1.DescribeResponse, error) {
		return oc.Describe(ctx)
	})
}

func (f *ownerForwarder) Predict(ctx context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	return forward(f.rt, ctx, "Predict", ownerSide, func(ctx context.Context, oc shared.OwnerCheck) (*pluginv1.PredictResponse, error) {
		return oc.Predict(ctx, req)
	})
}

// side picks one service out of a generation: its supervisor (nil for the built-in one), the
// built-in implementation, and the plugin's.
type side[S any] struct {
	supervisor func(*generation) *supervisor
	builtin    func(*generation) S
	plugin     func(*instance) S
}

var (
	retrySide = side[shared.RetryForcer]{
		supervisor: func(g *generation) *supervisor { return g.retry },
		builtin:    func(g *generation) shared.RetryForcer { return g.builtin.rf },
		plugin:     func(i *instance) shared.RetryForcer { return i.rf },
	}
	ownerSide = side[shared.OwnerCheck]{
		supervisor: func(g *generation) *supervisor { return g.owner },
		builtin:    func(g *generation) shared.OwnerCheck { return g.builtin.oc },
		plugin:     func(i *instance) shared.OwnerCheck { return i.oc },
	}
)

// forward calls the service of the current generation: the plugin (with the call deadline, and
// at once a *downError while it is down), or the built-in implementation.
func forward[S, T any](rt *Runtime, ctx context.Context, method string, sd side[S], f func(context.Context, S) (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		g := rt.gen.Load()
		sup := sd.supervisor(g)
		if sup == nil {
			impl := sd.builtin(g)
			return callBuiltin(rt, ctx, method, func(ctx context.Context) (T, error) { return f(ctx, impl) })
		}
		var out T
		err := sup.call(ctx, method, func(ctx context.Context, i *instance) error {
			var err error
			out, err = f(ctx, sd.plugin(i))
			return err
		})
		var down *downError
		if errors.As(err, &down) && attempt == 0 && rt.gen.Load() != g {
			continue // a reload swapped the plugin out under this call: ask the new one
		}
		return out, err
	}
}

// callBuiltin calls a built-in plugin and counts the call under "builtin".
func callBuiltin[T any](rt *Runtime, ctx context.Context, method string, f func(context.Context) (T, error)) (T, error) {
	start := time.Now()
	out, err := f(ctx)
	d := time.Since(start)
	timedOut := errors.Is(err, context.DeadlineExceeded)
	rt.builtinStats.record(d, err != nil, timedOut)
	rt.metrics.call(Builtin, method, d, err != nil, timedOut)
	return out, err
}

var (
	_ shared.RetryForcer = (*retryForwarder)(nil)
	_ shared.RetryForcer = (*fallbackForwarder)(nil)
	_ shared.OwnerCheck  = (*ownerForwarder)(nil)
)
