package retrypolicy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// Name is the name a Forcer gives in Describe.
const Name = "retry-forcer"

// Version is the version of the reference retry policies.
const Version = "0.1.0"

// capabilities are what a Forcer declares in Describe: the policies it offers, and give-up.
var capabilities = []string{Exponential, Fixed, Decorrelated, "max-attempts", "causes"}

// Forcer serves the reference policies as a shared.RetryForcer: the policy document chooses
// one, Configure swaps it atomically, and Schedule applies it to a stream's failing kinds. It is
// the retry-forcer plugin, and the host's built-in policy when run in-process. It is safe for
// concurrent use.
type Forcer struct {
	rnd    *source
	active atomic.Pointer[activePolicy]
}

// activePolicy is the policy in force and the config it was built from.
type activePolicy struct {
	cfg    Config
	policy Policy
}

var _ shared.RetryForcer = (*Forcer)(nil)

// New returns a Forcer running the default policy (see Default).
func New(opts ...Option) *Forcer {
	f := &Forcer{rnd: buildOptions(opts).rnd}
	f.active.Store(&activePolicy{cfg: Default(), policy: newPolicy(Default(), f.rnd)})
	return f
}

// Apply validates cfg and puts it in force. On error the previous policy stays.
func (f *Forcer) Apply(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	f.active.Store(&activePolicy{cfg: cfg, policy: newPolicy(cfg, f.rnd)})
	return nil
}

// Config returns the config of the policy in force.
func (f *Forcer) Config() Config { return f.active.Load().cfg }

// Policy returns the policy in force.
func (f *Forcer) Policy() Policy { return f.active.Load().policy }

// Describe names the plugin; max_delay and min_delay bound the delays of the policy in force.
func (f *Forcer) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	p := f.Policy()
	return &pluginv1.DescribeResponse{
		Name:         Name,
		Version:      Version,
		Capabilities: slices.Clone(capabilities),
		MaxDelay:     durationpb.New(p.MaxDelay()),
		MinDelay:     durationpb.New(p.Floor()),
		SampleConfig: DefaultSampleConfig,
	}, nil
}

// Configure parses the policy document and puts it in force; an empty document restores the
// default. A bad document is InvalidArgument naming the field, and the previous policy stays.
func (f *Forcer) Configure(_ context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	cfg, err := Parse(req.GetDocument())
	if err == nil {
		err = f.Apply(cfg)
	}
	if err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			return nil, shared.InvalidArgument(fe.Field, "%s", fe.Detail)
		}
		return nil, shared.InvalidArgument("document", "%v", err)
	}
	return &pluginv1.ConfigureResponse{Policy: f.Policy().String()}, nil
}

// Schedule returns the delay before the stream's next retry round, which resends every failing
// kind, or gives up when the policy's attempts are exhausted. The client's causes shape the round
// (see planByCause): TRANSIENT waits at most transientMax, MISSING_OWNER alone waits ownerWait,
// and an INVALID name refused as INVALID invalidAttempts times in a row is parked (put in hold)
// until its content changes; when every name is parked the answer has no delay. No delay is over
// the request's max_delay, the host's maximum.
func (f *Forcer) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	failing := req.GetFailing()
	if len(failing) == 0 {
		return nil, shared.InvalidArgument("failing", "must list at least one failing kind")
	}
	kinds := make([]string, 0, len(failing))
	for i, fk := range failing {
		if fk == nil {
			return nil, shared.InvalidArgument(fmt.Sprintf("failing[%d]", i), "must be set")
		}
		if fk.GetKind() == "" {
			return nil, shared.InvalidArgument(fmt.Sprintf("failing[%d].kind", i), "must not be empty")
		}
		kinds = append(kinds, fk.GetKind())
	}
	slices.Sort(kinds)
	kinds = slices.Compact(kinds)

	last := req.GetLastDelay()
	if last != nil {
		if err := last.CheckValid(); err != nil {
			return nil, shared.InvalidArgument("last_delay", "%v", err)
		}
		if last.AsDuration() < 0 {
			return nil, shared.InvalidArgument("last_delay", "must not be negative, got %s", last.AsDuration())
		}
	}

	var hostMax time.Duration // the host's --retry-max-delay; zero from a host that does not say
	if m := req.GetMaxDelay(); m != nil {
		if err := m.CheckValid(); err != nil {
			return nil, shared.InvalidArgument("max_delay", "%v", err)
		}
		if m.AsDuration() < 0 {
			return nil, shared.InvalidArgument("max_delay", "must not be negative, got %s", m.AsDuration())
		}
		hostMax = m.AsDuration()
	}

	active := f.active.Load()
	p, round := active.policy, req.GetRound()
	delay, giveUp := p.Next(round, last.AsDuration())
	if giveUp {
		return &pluginv1.ScheduleResponse{Kinds: kinds, GiveUp: true,
			Reason: fmt.Sprintf("%s: max attempts %d reached", p.Name(), active.cfg.MaxAttempts)}, nil
	}
	plan := planByCause(active.cfg, p, f.rnd, failing, delay)
	resp := &pluginv1.ScheduleResponse{Kinds: plan.kinds, Hold: plan.hold}
	resp.Reason = fmt.Sprintf("%s round %d%s", p.Name(), round, plan.why)
	if plan.delay > 0 {
		if hostMax > 0 && plan.delay > hostMax {
			plan.delay = hostMax
			resp.Reason += fmt.Sprintf(", capped at the host's max_delay %s", hostMax)
		}
		resp.Delay = durationpb.New(plan.delay)
	}
	return resp, nil
}
