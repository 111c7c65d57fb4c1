// Command panic-on-empty is a broken RetryForcer fixture: Schedule indexes the failing kinds
// without looking, and panics when there are none.
package main

import (
	"context"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

type panicky struct{ *fixture.Forcer }

func (p panicky) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	first := req.GetFailing()[0] // index out of range on an empty request
	resp, err := p.Forcer.Schedule(ctx, req)
	if resp != nil && !resp.GetGiveUp() {
		resp.Kinds = []string{first.GetKind()}
	}
	return resp, err
}

func main() { shared.ServeRetryForcer(panicky{fixture.New("panic-on-empty")}) }
