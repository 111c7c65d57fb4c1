// Command exceeds-host-max is a broken RetryForcer fixture: it declares max_delay 2h and waits 2h
// every round, over the host's bound (--retry-max-delay, 1h by default). It keeps its own
// promise, so schedule-bounds passes; the host refuses every one of its decisions.
package main

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

const delay = 2 * time.Hour

type twoHours struct{}

func (twoHours) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "exceeds-host-max", Version: "0.0.1",
		MaxDelay: durationpb.New(delay), MinDelay: durationpb.New(delay), SampleConfig: "{}"}, nil
}

func (twoHours) Configure(_ context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	if d := string(req.GetDocument()); d != "{}" && d != "" {
		return nil, shared.InvalidArgument("document", "takes no settings, want {}")
	}
	return &pluginv1.ConfigureResponse{Policy: "fixed 2h"}, nil
}

func (twoHours) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(delay), Reason: "two hours"}, nil
}

func main() { shared.ServeRetryForcer(twoHours{}) }
