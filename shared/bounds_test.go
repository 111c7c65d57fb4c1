package shared_test

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/durationpb"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

func TestBoundsCheckSchedule(t *testing.T) {
	req := &pluginv1.ScheduleRequest{Failing: []*pluginv1.FailingKind{
		{Kind: "Mesh", RejectedNames: []string{"default"}},
		{Kind: "MeshTimeout", RejectedNames: []string{"default/a"}},
	}}
	delay := func(d time.Duration) *pluginv1.ScheduleResponse {
		return &pluginv1.ScheduleResponse{Delay: durationpb.New(d)}
	}
	for _, tc := range []struct {
		name   string
		bounds shared.Bounds
		resp   *pluginv1.ScheduleResponse
		field  string // empty: accepted
		says   string
	}{
		{"a delay within bounds", shared.Bounds{}, delay(time.Second), "", ""},
		{"the longest delay", shared.Bounds{}, delay(time.Hour), "", ""},
		{"a give-up needs no delay", shared.Bounds{}, &pluginv1.ScheduleResponse{GiveUp: true, Reason: "done"}, "", ""},
		{"2h over the default 1h", shared.Bounds{}, delay(2 * time.Hour), "delay", "delay 2h0m0s is over the host's maximum of 1h0m0s (--retry-max-delay)"},
		{"over a configured maximum", shared.Bounds{MaxDelay: time.Minute}, delay(61 * time.Second), "delay", "is over the host's maximum of 1m0s"},
		{"no answer", shared.Bounds{}, nil, "the answer", "is empty"},
		{"no delay", shared.Bounds{}, &pluginv1.ScheduleResponse{}, "delay", "is missing"},
		{"a zero delay", shared.Bounds{}, delay(0), "delay", "0s is not positive"},
		{"a negative delay", shared.Bounds{}, delay(-time.Second), "delay", "-1s is not positive"},
		{"an invalid delay", shared.Bounds{}, &pluginv1.ScheduleResponse{Delay: &durationpb.Duration{Seconds: 1, Nanos: -1}}, "delay", "is not a valid duration"},
		{"a reason too long", shared.Bounds{}, &pluginv1.ScheduleResponse{GiveUp: true, Reason: strings.Repeat("x", 1025)}, "reason", "of 1025 bytes is over the host's maximum of 1024 bytes"},
		{"a kind that is not failing", shared.Bounds{}, &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Second), Kinds: []string{"Mesh", "MeshRetry"}},
			"kinds[1]", `"MeshRetry" is not a failing kind`},
		{"a held name that was not rejected", shared.Bounds{}, &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Second),
			Hold: []*pluginv1.HeldName{{Kind: "Mesh", Name: "default"}, {Kind: "Mesh", Name: "other"}}}, "hold[1]", `Mesh "other" is not a rejected name`},
		{"parking every rejected name needs no delay", shared.Bounds{}, &pluginv1.ScheduleResponse{
			Hold: []*pluginv1.HeldName{{Kind: "Mesh", Name: "default"}, {Kind: "MeshTimeout", Name: "default/a"}}}, "", ""},
		{"and any delay it gives is ignored", shared.Bounds{}, &pluginv1.ScheduleResponse{Delay: durationpb.New(-time.Second),
			Hold: []*pluginv1.HeldName{{Kind: "Mesh", Name: "default"}, {Kind: "MeshTimeout", Name: "default/a"}}}, "", ""},
		{"parking some names still needs a delay", shared.Bounds{}, &pluginv1.ScheduleResponse{
			Hold: []*pluginv1.HeldName{{Kind: "Mesh", Name: "default"}}}, "delay", "is missing"},
		{"a held name of another kind is not the rejected name", shared.Bounds{}, &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Second),
			Hold: []*pluginv1.HeldName{{Kind: "MeshTimeout", Name: "default"}}}, "hold[0]", `MeshTimeout "default" is not a rejected name`},
		{"a held name's reason too long", shared.Bounds{MaxReason: 4}, &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Second),
			Hold: []*pluginv1.HeldName{{Kind: "Mesh", Name: "default", Reason: "too long"}}}, "hold[0].reason", "of 8 bytes is over the host's maximum of 4 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := tc.bounds.CheckSchedule(req, tc.resp)
			if tc.field == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			var be *shared.BoundsError
			g.Expect(err).To(BeAssignableToTypeOf(be))
			g.Expect(err.(*shared.BoundsError).Field).To(Equal(tc.field))
			g.Expect(err.Error()).To(HavePrefix("the host refuses this schedule: "))
			g.Expect(err.Error()).To(ContainSubstring(tc.says))
		})
	}
}
