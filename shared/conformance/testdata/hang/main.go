// Command hang is a broken RetryForcer fixture: Schedule never returns and ignores its context.
package main

import (
	"context"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

type hang struct{ *fixture.Forcer }

func (hang) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	select {}
}

func main() { shared.ServeRetryForcer(hang{fixture.New("hang")}) }
