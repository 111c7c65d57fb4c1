package controlplane

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/host/resource"
)

// lookup finds states by stream, and counts the lookups.
func lookup(states []ZoneRetry, reads *int) func(stream int64) *ZoneRetry {
	byStream := map[int64]*ZoneRetry{}
	for i := range states {
		byStream[states[i].Stream] = &states[i]
	}
	return func(stream int64) *ZoneRetry {
		*reads++
		return byStream[stream]
	}
}

// Defect 1 of issue 21: /api/zones (polled every second) compared every zone with every retry
// state, 10^8 steps at 10,000 zones. The join now looks up each zone's stream once (its session).
func TestZoneViewsReadEachRetryStateOnce(t *testing.T) {
	g := NewWithT(t)
	const n = 2000
	insights := make([]engine.NodeInsight, n)
	states := make([]ZoneRetry, n)
	for i := range n {
		zone := fmt.Sprintf("zone-%04d", i)
		insights[i] = engine.NodeInsight{Node: zone, Connected: true, Stream: int64(i + 1)}
		states[i] = ZoneRetry{Stream: int64(n - i), Zone: fmt.Sprintf("zone-%04d", n-1-i), RoundState: retry.RoundState{Round: uint32(n - i)}}
	}
	reads := 0
	views := zoneViews(insights, lookup(states, &reads), nil)
	g.Expect(reads).To(Equal(n), "retry states read for %d zones x %d streams", n, n)
	g.Expect(views).To(HaveLen(n))
	for _, v := range views {
		g.Expect(v.Retry).NotTo(BeNil(), v.Zone)
		g.Expect(v.Retry.Stream).To(Equal(v.Stream))
		g.Expect(v.Retry.Round).To(Equal(uint32(v.Stream)))
	}
}

// A retry state goes only to a connected zone whose current stream it is.
func TestZoneViewsAttachARetryStateToTheZonesCurrentStreamOnly(t *testing.T) {
	g := NewWithT(t)
	insights := []engine.NodeInsight{
		{Node: "connected", Connected: true, Stream: 1},
		{Node: "gone", Connected: false, Stream: 2},                // left, within its grace
		{Node: "reconnected", Connected: true, Stream: 4},          // its old stream 3 still has state
		{Node: "no-state", Connected: true, Stream: 5},             // nothing failing
		{Node: "withheld", Connected: true, Stream: 6, Types: nil}, // owner holds only
	}
	states := []ZoneRetry{
		{Stream: 1, Zone: "connected", RoundState: retry.RoundState{Round: 1}},
		{Stream: 2, Zone: "gone", RoundState: retry.RoundState{Round: 2}},
		{Stream: 3, Zone: "reconnected", RoundState: retry.RoundState{Round: 3}},
		{Stream: 7, Zone: "elsewhere", RoundState: retry.RoundState{Round: 7}},
	}
	withheld := func(zone string) []Withheld {
		if zone != "withheld" {
			return nil
		}
		return []Withheld{{Key: resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "a"}, Verdict: "WAIT"}}
	}
	reads := 0
	views := zoneViews(insights, lookup(states, &reads), withheld)
	g.Expect(views).To(HaveLen(5))
	retryOf := map[string]*ZoneRetry{}
	for _, v := range views {
		retryOf[v.Zone] = v.Retry
	}
	g.Expect(retryOf["connected"]).To(Equal(&states[0]))
	g.Expect(retryOf["gone"]).To(BeNil(), "a zone that left shows no retry state")
	g.Expect(retryOf["reconnected"]).To(BeNil(), "the state of an older stream is not the zone's")
	g.Expect(retryOf["no-state"]).To(BeNil())
	g.Expect(views[4].Withheld).To(HaveLen(1))
	g.Expect(views[4].Kinds).To(HaveLen(1))
	g.Expect(views[4].Kinds[0].Kind).To(Equal("MeshTimeout"))
	g.Expect(views[4].Kinds[0].Withheld).To(Equal(1))

	// /api/zones: "withheld", and for one release the deprecated "held" beside it, at both levels.
	js, err := json.Marshal(views[4])
	g.Expect(err).NotTo(HaveOccurred())
	var view struct {
		Withheld, Held []json.RawMessage
		Kinds          []map[string]json.RawMessage
	}
	g.Expect(json.Unmarshal(js, &view)).To(Succeed())
	g.Expect(view.Withheld).To(HaveLen(1))
	g.Expect(view.Held).To(Equal(view.Withheld), "the deprecated JSON field is still emitted")
	g.Expect(view.Kinds).To(HaveLen(1))
	g.Expect(view.Kinds[0]).To(HaveKeyWithValue("withheld", MatchJSON("1")))
	g.Expect(view.Kinds[0]).To(HaveKeyWithValue("held", MatchJSON("1")), "the deprecated JSON field is still emitted")
}

// A name the zone rejected and owner holds now withhold is no round's to resend: the view names
// it in retryWithheld (the status page says "withheld", not "deciding", when that is all that
// fails). Names withheld but never rejected, and names rejected but not withheld, are not in it.
func TestZoneViewsNameTheRejectedNamesOwnerHoldsWithhold(t *testing.T) {
	g := NewWithT(t)
	insights := []engine.NodeInsight{{Node: "zone-1", Connected: true, Stream: 1}, {Node: "zone-2", Connected: true, Stream: 2}}
	states := []ZoneRetry{
		{Stream: 1, Zone: "zone-1", RoundState: retry.RoundState{Round: 4}, Failing: []FailingKind{
			{Kind: "Mesh", Failures: retry.Failures{Rejected: []string{"default"}}},
			{Kind: "MeshTimeout", Failures: retry.Failures{Rejected: []string{"default/a", "default/b", "other/a"}}},
		}},
		{Stream: 2, Zone: "zone-2", RoundState: retry.RoundState{Round: 1}, Failing: []FailingKind{{Kind: "MeshTimeout", Failures: retry.Failures{Rejected: []string{"default/b"}}}}},
	}
	withheld := func(zone string) []Withheld {
		return []Withheld{
			{Key: resource.Key{Kind: "Mesh", Name: "default"}, Verdict: "REJECT"},
			{Key: resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "a"}, Verdict: "WAIT"},
			{Key: resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "c"}, Verdict: "WAIT"},
			{Key: resource.Key{Kind: "MeshRetry", Mesh: "default", Name: "b"}, Verdict: "WAIT"},
		}
	}
	reads := 0
	views := zoneViews(insights, lookup(states, &reads), withheld)
	g.Expect(views[0].RetryWithheld).To(Equal(map[string][]string{"Mesh": {"default"}, "MeshTimeout": {"default/a"}}))
	g.Expect(views[1].RetryWithheld).To(BeNil(), "default/b is rejected, but only a MeshRetry of that name is withheld")
	js, err := json.Marshal(views[1])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(js)).NotTo(ContainSubstring("retryWithheld"))

	views = zoneViews(insights, lookup(states, &reads), nil)
	g.Expect(views[0].RetryWithheld).To(BeNil(), "owner holds off")
}

// A zone view answers the JSON of GET /api/zones as it always was, byte for byte, whatever the
// engine's insight calls its fields (node, types, type URL): its keys and their order, and a zone
// whose kinds are empty or not read says so as before ([] or null).
func TestAZoneViewAnswersTheAPIsJSON(t *testing.T) {
	since := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	meshTimeout := &engine.TypeInsight{TypeURL: "MeshTimeout", Sent: 5, Responses: 2, ACKs: 1, NACKs: 1, LastError: "bad spec",
		Rejected: []event.Rejection{{Name: "default/a", Reason: "bad spec", Cause: event.CauseInvalid}}, Known: 4}
	cases := []struct {
		name     string
		insight  engine.NodeInsight
		withheld bool
		want     string // the view's JSON
	}{
		{"counters and withheld", engine.NodeInsight{Node: "zone-1", Connected: true, Stream: 7, Since: since, Types: []*engine.TypeInsight{meshTimeout}}, true,
			`{"zone":"zone-1","connected":true,"stream":7,"since":"2025-01-02T03:04:05Z","kinds":[` +
				`{"kind":"Mesh","sent":0,"responses":0,"acks":0,"nacks":0,"withheld":1,"known":0,"held":1},` +
				`{"kind":"MeshTimeout","sent":5,"responses":2,"acks":1,"nacks":1,"lastError":"bad spec",` +
				`"rejected":[{"name":"default/a","reason":"bad spec","cause":"INVALID"}],"known":4}],` +
				`"withheld":[{"key":{"kind":"Mesh","name":"other"},"verdict":"WAIT"}],"held":[{"key":{"kind":"Mesh","name":"other"},"verdict":"WAIT"}]}`},
		{"no kinds yet", engine.NodeInsight{Node: "zone-2", Since: since, Types: []*engine.TypeInsight{}}, false,
			`{"zone":"zone-2","connected":false,"since":"2025-01-02T03:04:05Z","kinds":[]}`},
		{"kinds not read", engine.NodeInsight{Node: "zone-3", Since: since}, false,
			`{"zone":"zone-3","connected":false,"since":"2025-01-02T03:04:05Z","kinds":null}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			var withheld func(string) []Withheld
			if c.withheld {
				withheld = func(string) []Withheld {
					return []Withheld{{Key: resource.Key{Kind: "Mesh", Name: "other"}, Verdict: "WAIT"}}
				}
			}
			views := zoneViews([]engine.NodeInsight{c.insight}, nil, withheld)
			g.Expect(views).To(HaveLen(1))
			js, err := json.Marshal(views[0])
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(string(js)).To(Equal(c.want))
		})
	}
}
