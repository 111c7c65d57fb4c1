package policy_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/policy"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// A plugin built from plugin.v1 as it stood before rejection causes still serves this host:
// the request's new fields (each name's cause, owner and attempts) are unknown to it, and its
// answer is applied as it gives it.
func TestAPluginOfTheOlderContractStillServes(t *testing.T) {
	g := NewWithT(t)
	rt := start(t, config(policy.Spec{Path: testbin.Build(t, "./shared/conformance/testdata/v1plugin"), Document: doc("delay: 70ms\n")}))
	req := &pluginv1.ScheduleRequest{Zone: "zone-1", Failing: []*pluginv1.FailingKind{{
		Kind: "MeshTimeout", RejectedNames: []string{"default/a"}, NackCount: 1,
		Rejected: []*pluginv1.RejectedName{{Name: "default/a", Cause: kdsv1.Cause_CAUSE_MISSING_OWNER,
			MissingOwner: &kdsv1.ResourceKey{Kind: "Mesh", Name: "default"}, Attempts: 1}},
	}}}
	resp, err := rt.RetryForcer().Schedule(t.Context(), req)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetDelay().AsDuration()).To(Equal(70 * time.Millisecond))
	g.Expect(resp.GetHold()).To(BeEmpty())
	g.Expect(statusOf(rt, "v1plugin").Policy).To(Equal("fixed 70ms"))
}
