// Command never-gives-up is a broken RetryForcer fixture: it declares the max-attempts
// capability and accepts maxAttempts, but its limits are per kind and it never reads the top-level
// one, so it never gives up under the document the suite derives.
package main

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

type perKind struct{ *fixture.Forcer }

func (p perKind) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(p.Delay())}, nil
}

func main() { shared.ServeRetryForcer(perKind{fixture.New("never-gives-up")}) }
