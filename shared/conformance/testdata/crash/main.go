// Command crash is a broken RetryForcer fixture: Schedule crashes the process from a goroutine,
// where no recover in shared can catch it.
package main

import (
	"context"
	"time"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

type crash struct{ *fixture.Forcer }

func (crash) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	go func() {
		var counts map[string]int
		//lint:ignore SA5000 the fixture crashes on purpose
		counts["round"]++
	}()
	time.Sleep(time.Second)
	return nil, nil
}

func main() { shared.ServeRetryForcer(crash{fixture.New("crash")}) }
