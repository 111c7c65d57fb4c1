package kds_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
)

// refusals is an observer that keeps the refusals it hears of.
type refusals struct {
	mu  sync.Mutex
	all []event.Refusal
}

func (r *refusals) observer() event.Observer {
	return event.Observer{Refused: func(x event.Refusal) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.all = append(r.all, x)
	}}
}

func (r *refusals) reasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, x := range r.all {
		out = append(out, x.Reason)
	}
	return out
}

// boundedHarness serves MeshTimeout under the bounds given (names the global does not hold,
// bytes of a request), counting refusals.
func boundedHarness(t *testing.T, seen *refusals, maxUnknown, maxRequest int) *harness {
	return newHarness(t, []string{"MeshTimeout"}, func(h *harness) *engine.Tracker {
		tr := engine.NewTracker(h.cache, h.zones.Observer(), seen.observer())
		tr.SetLimits(engine.Limits{MaxUnknownNames: maxUnknown})
		h.server.MaxRequestBytes = maxRequest
		return tr
	})
}

func madeUp(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%06d", prefix, i)
	}
	return out
}

func versionsOf(names []string, version string) map[string]string {
	out := make(map[string]string, len(names))
	for _, n := range names {
		out[n] = version
	}
	return out
}

// Each bound of a zone stream's requests refuses the request that would pass it, with the code
// that says why, and counts it; nothing of the request is kept, and the zone's stream that was
// there before goes on: the bounds are checked before the zone's stream is replaced.
func TestAZoneStreamsRequestPastABoundIsRefusedAndCounted(t *testing.T) {
	node := &core.Node{Id: "zone-1"}
	cases := []struct {
		name   string
		req    *discovery.DeltaDiscoveryRequest
		code   codes.Code
		reason string
		says   string
	}{
		{"a request larger than the server's bound (--kds-max-request)",
			&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: "MeshTimeout", ResourceNamesSubscribe: madeUp(strings.Repeat("n", 40), 2_000)},
			codes.ResourceExhausted, "limit", "received message larger than max"},
		{"initial versions of names the global does not hold",
			&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: "MeshTimeout", InitialResourceVersions: versionsOf(madeUp("gone", 4), "1")},
			codes.ResourceExhausted, "limit", "more than 3 names the global does not hold"},
		{"names subscribed and reported held, together",
			&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: "MeshTimeout", ResourceNamesSubscribe: madeUp("asked", 2), InitialResourceVersions: versionsOf(madeUp("gone", 2), "1")},
			codes.ResourceExhausted, "limit", "--kds-max-unknown-names"},
		{"more names than any request may carry, counted before they are decoded",
			&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: "MeshTimeout", ResourceNamesSubscribe: madeUp("asked", 3), InitialResourceVersions: versionsOf(madeUp("gone", 3), "1")},
			codes.ResourceExhausted, "limit", "this request names 6 resources"},
		{"a type URL the global does not serve",
			&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: "type.googleapis.com/made.up.Kind"},
			codes.InvalidArgument, "invalid", `"type.googleapis.com/made.up.Kind" is not a kind this control plane serves (it serves MeshTimeout)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			seen := &refusals{}
			h := boundedHarness(t, seen, 3, 64<<10)
			h.set([]resource.Resource{policy("MeshTimeout", "default", "held", `{}`)})
			h.subscribe("MeshTimeout")
			h.ack(h.recv())

			h2 := h.reconnect(t)
			g.Expect(h2.stream.Send(c.req)).To(Succeed())
			var err error
			g.Eventually(h2.ended, 10*time.Second).Should(Receive(&err))
			g.Expect(status.Code(err)).To(Equal(c.code), "%v", err)
			g.Expect(status.Convert(err).Message()).To(ContainSubstring(c.says))
			g.Eventually(seen.reasons).Should(Equal([]string{c.reason}))

			// The zone's stream before is still its stream, and is sent what changes.
			g.Expect(h.ended).NotTo(Receive())
			h.set([]resource.Resource{policy("MeshTimeout", "default", "held", `{"x":1}`)})
			g.Expect(h.recv().Resources).To(HaveLen(1))
		})
	}
}

// The initial versions of names the global holds cost nothing against the bound, whatever their
// version; those of names it does not hold count with the names subscribed to, up to the bound.
func TestInitialVersionsOfNamesTheGlobalHoldsAreNotCounted(t *testing.T) {
	g := NewWithT(t)
	seen := &refusals{}
	h := boundedHarness(t, seen, 3, 64<<10)
	var rs []resource.Resource
	initial := map[string]string{}
	for i := range 5 {
		rs = append(rs, policy("MeshTimeout", "default", fmt.Sprintf("held-%d", i), `{}`))
		initial[fmt.Sprintf("default/held-%d", i)] = "an-older-version"
	}
	for _, n := range madeUp("gone", 3) {
		initial[n] = "1"
	}
	h.set(rs)
	g.Expect(h.stream.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "zone-1"}, TypeUrl: "MeshTimeout", InitialResourceVersions: initial})).To(Succeed())
	r := h.recv()
	g.Expect(r.Resources).To(HaveLen(5), "the held names at their version")
	g.Expect(r.RemovedResources).To(ConsistOf(madeUp("gone", 3)), "what the global does not hold")
	h.ack(r)
	g.Expect(h.ended).NotTo(Receive())
	g.Expect(seen.reasons()).To(BeEmpty())
}

// A closed stream's session stays readable through its zone's grace (what the zone holds, the
// insight), but lets go at once of what only the stream needed: its requests, its subscriptions
// and the watches its responses answered. A zone that reported holding 30,000 names when it
// subscribed, and left a response unanswered, costs the global its inventory once its stream has
// closed, and not the 30,000 names and versions of its request as well.
func TestAClosedStreamLetsGoOfItsRequestsAtOnce(t *testing.T) {
	g := NewWithT(t)
	const n = 30_000
	seen := &refusals{}
	h := boundedHarness(t, seen, 3, 0)
	h.cache.SetSnapshot(engine.SnapshotOf(entries(t, "MeshTimeout", n+1)))
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	initial := map[string]string{}
	for _, e := range h.cache.Snapshot().Type("MeshTimeout") {
		initial[e.Name] = e.Version
	}
	last := fmt.Sprintf("default/p-%06d", n)
	delete(initial, last) // the zone holds every name but one

	g.Expect(h.stream.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "zone-1"}, TypeUrl: "MeshTimeout", InitialResourceVersions: initial})).To(Succeed())
	initial = nil
	g.Expect(deltaNamesOf(h.recv())).To(Equal([]string{last}), "the one it lacks, left unanswered")
	g.Expect(h.stream.CloseSend()).To(Succeed())
	g.Eventually(h.ended, 10*time.Second).Should(Receive())
	g.Eventually(func() bool { z, _ := h.zones.Insight("zone-1"); return z.Connected }).Should(BeFalse())
	z, ok := h.zones.Insight("zone-1")
	g.Expect(ok).To(BeTrue(), "the zone is within its grace")
	g.Expect(z.Types).To(ConsistOf(HaveField("Known", n)))

	grown := int64(heap()) - int64(before)
	t.Logf("the heap grew by %d bytes (%d a name the zone reported) with the closed stream's session kept", grown, grown/n)
	g.Expect(grown).To(BeNumerically("<", 80*n), "what the zone holds (a name -> resource map), not its request as well")
	g.Expect(seen.reasons()).To(BeEmpty())
}

func deltaNamesOf(r *discovery.DeltaDiscoveryResponse) []string {
	var out []string
	for _, res := range r.Resources {
		out = append(out, res.Name)
	}
	return out
}

// entries are n entries of kind, default/p-000000 and on, each a copy of one policy's encoding
// (many entries, made fast).
func entries(t *testing.T, kind string, n int) []*engine.Entry {
	e0, err := kds.NewEntry(&resource.Resource{Kind: kind, Mesh: "default", Name: "p", Spec: []byte(`{}`), Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*engine.Entry, n)
	for i := range out {
		key := resource.Key{Kind: kind, Mesh: "default", Name: fmt.Sprintf("p-%06d", i)}
		e := &engine.Entry{TypeURL: kind, Name: key.XDSName(), Version: e0.Version, Source: &kds.Source{Key: key, Resource: kds.ResourceOf(e0)}, Any: e0.Any,
			Wire: &discovery.Resource{Name: key.XDSName(), Version: e0.Version, Resource: e0.Any}}
		if err := e.EncodeWire(); err != nil {
			t.Fatal(err)
		}
		out[i] = e
	}
	return out
}
