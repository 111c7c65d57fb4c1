// Command exceeds-max is a broken RetryForcer fixture: it declares max_delay 1s and doubles the
// delay every round without a cap.
package main

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

type uncapped struct{ *fixture.Forcer }

func (u uncapped) Schedule(_ context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	d := u.Delay() << min(req.GetRound(), 20)
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(d)}, nil
}

func main() { shared.ServeRetryForcer(uncapped{fixture.New("exceeds-max")}) }
