package main

import (
	"bytes"
	"encoding/json"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/spf13/cobra"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/host/controlplane"
)

func TestInspectZonesShowsCausesAndWhatIsWithheldAndParked(t *testing.T) {
	g := NewWithT(t)
	var out bytes.Buffer
	cmd := &cobra.Command{}
	cmd.SetOut(&out)
	list := zoneList{Total: 1, Items: []controlplane.ZoneView{{
		Zone: "zone-1", Connected: true, Kinds: []*controlplane.KindView{
			{Kind: "Mesh", NACKs: 2, Rejected: []event.Rejection{{Name: "default", Cause: event.CauseTransient}}},
			{Kind: "MeshTimeout", NACKs: 3, Rejected: []event.Rejection{{Name: "default/bad", Cause: event.CauseInvalid}}},
		},
		Retry: &controlplane.ZoneRetry{Zone: "zone-1", RoundState: retry.RoundState{Round: 2, Reason: "fixed 250ms"}, Failing: []controlplane.FailingKind{
			{Kind: "Mesh", Failures: retry.Failures{Rejected: []string{"default"}}},
			{Kind: "MeshTimeout", Parked: []controlplane.ParkedName{{Kind: "MeshTimeout", Name: "default/bad", Reason: "the zone refused this content as invalid 3 times; parked until it changes"}}},
		}},
	}}}
	list.Items[0].Kinds[1].Sent, list.Items[0].Kinds[1].Responses, list.Items[0].Kinds[1].Known = 30, 3, 27
	list.Items[0].Kinds[1].Withheld = 2
	g.Expect(printZones(cmd, list)).To(Succeed())
	g.Expect(out.String()).To(ContainSubstring("count resources; RESPONSES, ACKED and NACKED count responses"))
	g.Expect(out.String()).To(MatchRegexp(`MeshTimeout\s+30\s+27\s+2\s+default/bad \(INVALID\)\s+3\s+0\s+3`), "resources first, then responses")
	g.Expect(out.String()).To(ContainSubstring("default (TRANSIENT)"))
	g.Expect(out.String()).To(MatchRegexp(`(?m)^ZONE\s+KIND\s+SENT\s+KNOWN\s+WITHHELD\s+REJECTED\s+RESPONSES\s+ACKED\s+NACKED\s+ROUND\s+NEXT RETRY\s+REASON$`))
	g.Expect(out.String()).To(ContainSubstring("SENT, KNOWN (the zone has ACKed) and WITHHELD (by owner holds) count resources"))
	g.Expect(out.String()).To(MatchRegexp(`(?m)^zone-1 \(connected\) +Mesh .* 2 +- +fixed 250ms$`), "the reason of the decision in force")
	g.Expect(out.String()).To(ContainSubstring("default/bad (INVALID)"))
	g.Expect(out.String()).To(ContainSubstring("Parked (not resent until their content changes):\n  zone-1 MeshTimeout default/bad: the zone refused this content as invalid 3 times"))
}

// A global of the release before sends the deprecated "held" fields only: the table still shows them.
func TestInspectZonesReadsTheDeprecatedHeldFields(t *testing.T) {
	g := NewWithT(t)
	var out bytes.Buffer
	cmd := &cobra.Command{}
	cmd.SetOut(&out)
	var list zoneList
	g.Expect(json.Unmarshal([]byte(`{"total":1,"items":[{"zone":"zone-1","connected":true,
		"kinds":[{"kind":"MeshTimeout","sent":4,"known":1,"held":2}],
		"retry":{"zone":"zone-1","round":0,"failing":[{"kind":"MeshTimeout","rejected":[],
			"held":[{"kind":"MeshTimeout","name":"default/bad","reason":"invalid 3 times"}]}]}}]}`), &list)).To(Succeed())
	g.Expect(printZones(cmd, list)).To(Succeed())
	g.Expect(out.String()).To(MatchRegexp(`MeshTimeout\s+4\s+1\s+2\s+-`))
	g.Expect(out.String()).To(ContainSubstring("Parked (not resent until their content changes):\n  zone-1 MeshTimeout default/bad: invalid 3 times"))
}
