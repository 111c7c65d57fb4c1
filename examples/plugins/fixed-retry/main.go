// Command fixed-retry is a complete kds-host retry plugin: a fixed delay every round, and a
// give-up after maxAttempts rounds (0: never). Its policy document: "delay: 500ms\nmaxAttempts: 5".
package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"google.golang.org/protobuf/types/known/durationpb"
	"sigs.k8s.io/yaml"
)

type policy struct {
	Delay       string `json:"delay"`
	MaxAttempts uint32 `json:"maxAttempts"`
	delay       time.Duration
}

type fixedRetry struct{ p atomic.Pointer[policy] }

func (f *fixedRetry) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "fixed-retry", Version: "1.0.0", Capabilities: []string{"max-attempts"},
		MaxDelay: durationpb.New(f.p.Load().delay), MinDelay: durationpb.New(f.p.Load().delay), SampleConfig: "delay: 500ms\nmaxAttempts: 0\n"}, nil
}

func (f *fixedRetry) Configure(_ context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	p := &policy{}
	if err := yaml.UnmarshalStrict(req.GetDocument(), p); err != nil {
		return nil, shared.InvalidArgument("document", "%v", err)
	} else if p.delay, err = time.ParseDuration(p.Delay); err != nil || p.delay <= 0 {
		return nil, shared.InvalidArgument("delay", "want a positive duration such as 500ms, got %q", p.Delay)
	}
	f.p.Store(p)
	return &pluginv1.ConfigureResponse{Policy: "fixed " + p.delay.String()}, nil
}

func (f *fixedRetry) Schedule(_ context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	p, hostMax := f.p.Load(), req.GetMaxDelay().AsDuration() // the host's --retry-max-delay
	if p.MaxAttempts > 0 && req.GetRound() >= p.MaxAttempts {
		return &pluginv1.ScheduleResponse{GiveUp: true, Reason: "max attempts reached"}, nil
	}
	if hostMax > 0 && hostMax < p.delay {
		return &pluginv1.ScheduleResponse{Delay: durationpb.New(hostMax)}, nil
	}
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(p.delay)}, nil
}

func main() {
	f := &fixedRetry{}
	f.p.Store(&policy{Delay: "500ms", delay: 500 * time.Millisecond})
	shared.ServeRetryForcer(f)
}
