package policy

import (
	"context"
	"errors"
	"time"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// describer is what both plugin kinds answer.
type describer interface {
	Describe(ctx context.Context) (*pluginv1.DescribeResponse, error)
}

// forwarder is one service of the current generation, as the Runtime hands it out: every call
// goes to what the generation has in force on its side (see forward).
type forwarder[S describer] struct {
	rt   *Runtime
	side side[S]
}

func (f *forwarder[S]) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	return forward(f.rt, ctx, "Describe", f.side, func(ctx context.Context, s S) (*pluginv1.DescribeResponse, error) {
		return s.Describe(ctx)
	})
}

// retryForwarder is Runtime.RetryForcer (retrySide: the RetryForcer plugin of the current
// generation, or the built-in policy when there is none) and Runtime.Fallback (fallbackSide:
// always the built-in policy).
type retryForwarder struct{ forwarder[shared.RetryForcer] }

// Configure reaches the policy in force now. A restart re-applies the document the plugin was
// loaded with, so lasting changes go through Reload.
func (f *retryForwarder) Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return forward(f.rt, ctx, "Configure", f.side, func(ctx context.Context, rf shared.RetryForcer) (*pluginv1.ConfigureResponse, error) {
		return rf.Configure(ctx, req)
	})
}

// Schedule holds the answer to the host's bounds (Options.Bounds): one outside them is a failed
// call of the plugin that gave it, a *shared.BoundsError.
func (f *retryForwarder) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	return forward(f.rt, ctx, "Schedule", f.side, func(ctx context.Context, rf shared.RetryForcer) (*pluginv1.ScheduleResponse, error) {
		resp, err := rf.Schedule(ctx, req)
		if err != nil {
			return nil, err
		}
		if err := f.rt.cfg.Bounds.CheckSchedule(req, resp); err != nil {
			return nil, err
		}
		return resp, nil
	})
}

// ownerForwarder is Runtime.OwnerCheck: the OwnerCheck plugin of the current generation, or the
// built-in owner check when there is none.
type ownerForwarder struct{ forwarder[shared.OwnerCheck] }

func (f *ownerForwarder) Predict(ctx context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	return forward(f.rt, ctx, "Predict", f.side, func(ctx context.Context, oc shared.OwnerCheck) (*pluginv1.PredictResponse, error) {
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
	fallbackSide = side[shared.RetryForcer]{
		supervisor: func(*generation) *supervisor { return nil },
		builtin:    func(g *generation) shared.RetryForcer { return g.builtin.rf },
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
			out, err := callBuiltin(rt, ctx, method, func(ctx context.Context) (T, error) { return f(ctx, impl) })
			rt.refused(Builtin, method, err)
			return out, err
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
		rt.refused(sup.name, method, err)
		return out, err
	}
}

// refused logs, at WARN, an answer the host refused because it is outside the host's bounds.
func (rt *Runtime) refused(plugin, method string, err error) {
	be, ok := errors.AsType[*shared.BoundsError](err)
	if !ok {
		return
	}
	rt.log.Warn("plugin answer refused: it is outside the host's bounds, so it counts as an error of the plugin and the fallback decides",
		"plugin", plugin, "method", method, "field", be.Field, "value", be.Value, "limit", be.Limit)
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
	_ shared.OwnerCheck  = (*ownerForwarder)(nil)
)
