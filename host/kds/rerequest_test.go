package kds_test

import (
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/host/resource"
)

// reRequests records the tracker's re-request events.
type reRequests struct {
	mu     sync.Mutex
	events []event.ReRequest
}

func (r *reRequests) observer() event.Observer {
	return event.Observer{ReRequest: func(e event.ReRequest) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.events = append(r.events, e)
	}}
}

func (r *reRequests) answered() (yes, no int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Answered {
			yes++
		} else {
			no++
		}
	}
	return yes, no
}

func harnessWithLimit(limit engine.RateLimit, rec *reRequests) func(h *harness) *engine.Tracker {
	return func(h *harness) *engine.Tracker {
		tr := engine.NewTracker(h.cache, h.zones.Observer(), rec.observer())
		tr.SetLimits(engine.Limits{ReRequests: limit})
		return tr
	}
}

// The zone asks again for a name it refused (it subscribes to it again): the global answers at
// once with the name's current content, and nothing else.
func TestAReRequestIsAnsweredAtOnce(t *testing.T) {
	g := NewWithT(t)
	rec := &reRequests{}
	h := newHarness(t, []string{"MeshTimeout"}, harnessWithLimit(engine.DefaultReRequestLimit(), rec))
	h.set([]resource.Resource{policy("MeshTimeout", "default", "a", `{}`), policy("MeshTimeout", "default", "b", `{}`)})
	h.subscribe("MeshTimeout")
	r := h.recv()
	g.Expect(r.Resources).To(HaveLen(2))
	h.nack(r, "default/a")
	h.expectQuiet(100 * time.Millisecond) // a NACK by itself resends nothing

	g.Expect(h.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResourceNamesSubscribe: []string{"default/a"}})).To(Succeed())
	again := h.recv()
	g.Expect(again.Resources).To(HaveLen(1))
	g.Expect(again.Resources[0].Name).To(Equal("default/a"))
	g.Expect(again.Resources[0].Version).To(Equal(r.Resources[0].Version))
	h.ack(again)
	h.expectQuiet(100 * time.Millisecond)
	yes, no := rec.answered()
	g.Expect([]int{yes, no}).To(Equal([]int{1, 0}))

	// A new policy still arrives: the subscription is still a wildcard.
	h.update([]resource.Resource{policy("MeshTimeout", "default", "c", `{}`)})
	g.Expect(h.recv().Resources[0].Name).To(Equal("default/c"))
}

// A zone that asks again and again gets the stream's rate limit: the rest are not answered.
func TestReRequestsAreRateLimitedPerStream(t *testing.T) {
	g := NewWithT(t)
	rec := &reRequests{}
	h := newHarness(t, []string{"MeshTimeout"}, harnessWithLimit(engine.RateLimit{Rate: 1e-6, Burst: 3}, rec))
	h.set([]resource.Resource{policy("MeshTimeout", "default", "a", `{}`)})
	h.subscribe("MeshTimeout")
	h.ack(h.recv())
	for range 10 {
		g.Expect(h.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResourceNamesSubscribe: []string{"default/a"}})).To(Succeed())
	}
	g.Eventually(func() int { yes, no := rec.answered(); return yes + no }, 10*time.Second).Should(Equal(10))
	yes, no := rec.answered()
	g.Expect([]int{yes, no}).To(Equal([]int{3, 7}))
	// Each answered one made the server send the name again (some may coalesce into one
	// response while the previous is not ACKed yet); the limited ones sent nothing.
	got := 0
	for {
		select {
		case r := <-h.in:
			got += len(r.Resources)
			h.ack(r)
			continue
		case <-time.After(300 * time.Millisecond):
		}
		break
	}
	g.Expect(got).To(BeNumerically(">=", 1))
	g.Expect(got).To(BeNumerically("<=", 3))
}

// The re-request budget counts names, not requests, and is the zone's across its streams: a
// zone that reconnects does not find it full again (before, 30 reconnects got 49 answers a
// second against a limit of 20).
func TestTheReRequestBudgetCountsNamesAndOutlivesAStream(t *testing.T) {
	g := NewWithT(t)
	rec := &reRequests{}
	h := newHarness(t, []string{"MeshTimeout"}, harnessWithLimit(engine.RateLimit{Rate: 1e-6, Burst: 4}, rec))
	h.set([]resource.Resource{policy("MeshTimeout", "default", "a", `{}`), policy("MeshTimeout", "default", "b", `{}`), policy("MeshTimeout", "default", "c", `{}`)})
	h.subscribe("MeshTimeout")
	h.ack(h.recv())
	again := func(names ...string) {
		g.Expect(h.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResourceNamesSubscribe: names})).To(Succeed())
	}
	again("default/a", "default/b", "default/c") // 3 of 4
	again("default/a", "default/b")              // 2 more: refused
	again("default/a")                           // the last one
	g.Eventually(func() int { yes, no := rec.answered(); return yes + no }, 10*time.Second).Should(Equal(3))
	yes, no := rec.answered()
	g.Expect([]int{yes, no}).To(Equal([]int{2, 1}))

	// A new stream of the same zone finds the budget spent.
	h2 := h.reconnect(t)
	h2.subscribe("MeshTimeout")
	h2.ack(h2.recv())
	g.Expect(h2.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResourceNamesSubscribe: []string{"default/a"}})).To(Succeed())
	g.Eventually(func() int { yes, no := rec.answered(); return yes + no }, 10*time.Second).Should(Equal(4))
	yes, no = rec.answered()
	g.Expect([]int{yes, no}).To(Equal([]int{2, 2}))
}
