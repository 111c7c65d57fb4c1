// Command shrinks is a broken RetryForcer fixture: it declares its delay as min_delay, and from
// round 3 on answers a tenth of it, under its own floor.
package main

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

type shrinks struct{ *fixture.Forcer }

func (s shrinks) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	d, err := s.Forcer.Describe(ctx)
	if err == nil {
		d.MinDelay = durationpb.New(s.Delay())
	}
	return d, err
}

func (s shrinks) Schedule(_ context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	d := s.Delay()
	if req.GetRound() >= 3 {
		d /= 10
	}
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(d)}, nil
}

func main() { shared.ServeRetryForcer(shrinks{fixture.New("shrinks")}) }
