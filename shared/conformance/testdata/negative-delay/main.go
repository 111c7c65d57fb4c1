// Command negative-delay is a broken RetryForcer fixture: each round takes 60ms off the delay,
// so from round 2 on the delay is negative.
package main

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

type negative struct{ *fixture.Forcer }

func (n negative) Schedule(_ context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	d := n.Delay() - time.Duration(req.GetRound())*60*time.Millisecond
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(d)}, nil
}

func main() { shared.ServeRetryForcer(negative{fixture.New("negative-delay")}) }
