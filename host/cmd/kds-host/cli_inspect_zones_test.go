package main

import (
	"bytes"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/spf13/cobra"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/event"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/retry"
)

func TestInspectZonesShowsCausesAndWhatIsHeld(t *testing.T) {
	g := NewWithT(t)
	var out bytes.Buffer
	cmd := &cobra.Command{}
	cmd.SetOut(&out)
	list := zoneList{Total: 1, Items: []controlplane.ZoneView{{
		ZoneInsight: kds.ZoneInsight{Zone: "zone-1", Connected: true, Kinds: []*kds.KindInsight{
			{Kind: "Mesh", NACKs: 2, Rejected: []event.Rejection{{Name: "default", Cause: event.CauseTransient}}},
			{Kind: "MeshTimeout", NACKs: 3, Rejected: []event.Rejection{{Name: "default/bad", Cause: event.CauseInvalid}}},
		}},
		Retry: &retry.StreamState{Zone: "zone-1", Round: 2, Reason: "fixed 250ms", Failing: []retry.KindState{
			{Kind: "Mesh", Rejected: []string{"default"}},
			{Kind: "MeshTimeout", Held: []retry.HeldName{{Kind: "MeshTimeout", Name: "default/bad", Reason: "the zone refused this content as invalid 3 times; held until it changes"}}},
		}},
	}}}
	list.Items[0].Kinds[1].Sent, list.Items[0].Kinds[1].Responses, list.Items[0].Kinds[1].Known = 30, 3, 27
	g.Expect(printZones(cmd, list)).To(Succeed())
	g.Expect(out.String()).To(ContainSubstring("count resources; RESPONSES, ACKED and NACKED count responses"))
	g.Expect(out.String()).To(MatchRegexp(`MeshTimeout\s+30\s+27\s+0\s+default/bad \(INVALID\)\s+3\s+0\s+3`), "resources first, then responses")
	g.Expect(out.String()).To(ContainSubstring("default (TRANSIENT)"))
	g.Expect(out.String()).To(MatchRegexp(`(?m)^ZONE .* REASON$`))
	g.Expect(out.String()).To(MatchRegexp(`(?m)^zone-1 \(connected\) +Mesh .* 2 +- +fixed 250ms$`), "the reason of the decision in force")
	g.Expect(out.String()).To(ContainSubstring("default/bad (INVALID)"))
	g.Expect(out.String()).To(ContainSubstring("Not resent until their content changes:\n  zone-1 MeshTimeout default/bad: the zone refused this content as invalid 3 times"))
}
