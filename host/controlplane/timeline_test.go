package controlplane

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/retry"
)

func TestATimelineKeepsTheLatestEventsOfKnownZonesOnly(t *testing.T) {
	g := NewWithT(t)
	tl := newTimeline()
	var rounds int
	obs, hooks := tl.observer(), tl.hooks(retry.Hooks{Round: func(string, time.Duration, map[string]int) { rounds++ }})

	// Nothing is kept for a zone whose stream never opened (or that was forgotten).
	obs.NACK(event.NACK{Node: "ghost", TypeURL: "Mesh"})
	hooks.Round("ghost", time.Second, map[string]int{"Mesh": 1})
	hooks.GaveUp("ghost", "no")
	g.Expect(tl.report("").Zones).To(BeEmpty())
	g.Expect(rounds).To(Equal(1), "the wrapped hook is still called")

	obs.StreamOpened(1, "zone-1")
	obs.NACK(event.NACK{Node: "zone-1", TypeURL: "Mesh", Rejected: []event.Rejection{{Name: "default"}}, Detail: strings.Repeat("é", 500)})
	hooks.Round("zone-1", 100*time.Millisecond, map[string]int{"Mesh": 1})
	obs.NACK(event.NACK{Node: "zone-1", TypeURL: "Mesh"})
	hooks.Round("zone-1", 200*time.Millisecond, map[string]int{"Mesh": 1})
	obs.ACK(event.ACK{Node: "zone-1", TypeURL: "MeshTimeout"}) // never NACKed: nothing to recover
	obs.ACK(event.ACK{Node: "zone-1", TypeURL: "Mesh"})
	hooks.GaveUp("zone-1", "max attempts")
	obs.StreamClosed(1, "zone-1")

	ev := tl.report("zone-1").Zones["zone-1"]
	types := make([]string, len(ev))
	for i, e := range ev {
		types[i] = e.Type
	}
	g.Expect(types).To(Equal([]string{TimelineConnected, TimelineNACK, TimelineRound, TimelineNACK, TimelineRound, TimelineRecovered, TimelineGaveUp, TimelineDisconnected}))
	g.Expect(ev[1].Count).To(Equal(1))
	g.Expect(len(ev[1].Detail)).To(BeNumerically("<=", timelineDetailMax+len("…")))
	g.Expect(strings.ToValidUTF8(ev[1].Detail, "?")).To(Equal(ev[1].Detail), "cut on a rune boundary")
	g.Expect([]int{ev[2].Round, ev[4].Round}).To(Equal([]int{1, 2}))
	g.Expect(ev[4].Delay).To(Equal("200ms"))
	g.Expect(ev[5].Kind).To(Equal("Mesh"))
	g.Expect(ev[6].Detail).To(Equal("max attempts"))

	// The ring keeps the latest timelineCap events, oldest first.
	obs.StreamOpened(2, "zone-1")
	for i := range 3 * timelineCap {
		hooks.Round("zone-1", time.Duration(i+1)*time.Millisecond, nil)
	}
	ev = tl.report("").Zones["zone-1"]
	g.Expect(ev).To(HaveLen(timelineCap))
	g.Expect(ev[0].Delay).To(Equal((time.Duration(2*timelineCap+1) * time.Millisecond).String()))
	g.Expect(ev[timelineCap-1].Round).To(Equal(3 * timelineCap))

	// A zone that leaves leaves nothing.
	tl.forget("zone-1")
	g.Expect(tl.zones).To(BeEmpty())
	obs.NACK(event.NACK{Node: "zone-1", TypeURL: "Mesh"})
	g.Expect(tl.zones).To(BeEmpty())
}
