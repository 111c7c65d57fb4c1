package owner_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.uber.org/goleak"

	"github.com/kds-host/kds-host/host/event"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/owner"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	"github.com/kds-host/kds-host/shared"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// world is the global as Holds sees it: a snapshot, the zones' inventories, the refreshes.
type world struct {
	mu        sync.Mutex
	snap      *kds.Snapshot
	inventory map[string]map[string]map[string]string // zone -> kind -> name -> version
	refreshed map[string][]string                     // zone -> "kind name" refreshed
}

func (w *world) Snapshot() *kds.Snapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.snap
}

func (w *world) Versions(zone string) map[string]map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]map[string]string{}
	for kind, names := range w.inventory[zone] {
		out[kind] = map[string]string{}
		for n, v := range names {
			out[kind][n] = v
		}
	}
	return out
}

func (w *world) Connected() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for z := range w.inventory {
		out = append(out, z)
	}
	return out
}

func (w *world) Refresh(zone string, names map[string][]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for kind, ns := range names {
		for _, n := range ns {
			w.refreshed[zone] = append(w.refreshed[zone], kind+" "+n)
		}
	}
}

func (w *world) hold(zone string, k resource.Key) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inventory[zone] == nil {
		w.inventory[zone] = map[string]map[string]string{}
	}
	if w.inventory[zone][k.Kind] == nil {
		w.inventory[zone][k.Kind] = map[string]string{}
	}
	w.inventory[zone][k.Kind][k.XDSName()] = version(w.snap, k)
}

func newHolds(t *testing.T, w *world) *owner.Holds {
	t.Helper()
	p := ownerpredict.New()
	h, err := owner.New(owner.Config{Policy: func() shared.OwnerCheck { return p }, Source: w, Inventory: w, Refresher: w})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func TestHoldsWaitForTheOwnersACKAndFreeAZoneThatLeaves(t *testing.T) {
	g := NewWithT(t)
	w := &world{snap: snapshot(t, meshKey, timeoutKey), inventory: map[string]map[string]map[string]string{"zone-1": {}}, refreshed: map[string][]string{}}
	h := newHolds(t, w)
	obs := h.Observer()
	obs.StreamOpened(1, "zone-1")
	g.Eventually(func() []owner.Held { return h.Held("zone-1") }).Should(HaveLen(1))
	g.Expect(h.Held("zone-1")[0].Verdict).To(Equal(owner.Wait))
	g.Expect(h.Visible("zone-1", w.snap.Kind("Mesh")["default"])).To(BeTrue())
	g.Expect(h.Visible("zone-1", w.snap.Kind("MeshTimeout")["default/t"])).To(BeFalse())

	// The zone ACKs its Mesh: the policy is released, and its name refreshed.
	w.hold("zone-1", meshKey)
	obs.ACK(event.ACK{StreamID: 1, Zone: "zone-1", Kind: "Mesh", Versions: map[string]string{"default": version(w.snap, meshKey)}})
	g.Eventually(func() []owner.Held { return h.Held("zone-1") }).Should(BeEmpty())
	g.Expect(h.Visible("zone-1", w.snap.Kind("MeshTimeout")["default/t"])).To(BeTrue())
	w.mu.Lock()
	g.Expect(w.refreshed["zone-1"]).To(ContainElement("MeshTimeout default/t"))
	w.mu.Unlock()

	// A second stream of the zone replaces the first: the first's close frees nothing.
	obs.StreamOpened(2, "zone-1")
	obs.StreamClosed(1, "zone-1")
	g.Expect(h.Zones()).To(Equal(1))
	g.Eventually(func() bool { return h.Visible("zone-1", w.snap.Kind("Mesh")["default"]) }).Should(BeTrue())

	// Defect 5: the verdicts of a zone that left were never freed. They outlive its last stream
	// for its grace period (a zone back soon is not checked from scratch), then Forget frees them.
	obs.StreamClosed(2, "zone-1")
	g.Expect(h.Zones()).To(Equal(1), "kept for the grace period")
	h.Forget("zone-1")
	g.Expect(h.Zones()).To(BeZero())
	g.Expect(h.Held("zone-1")).To(BeEmpty())
	g.Expect(h.Visible("zone-1", w.snap.Kind("Mesh")["default"])).To(BeFalse())
}

// BenchmarkACKWithManyWaiting is the cost of an ACK on the stream's goroutine while 10,000
// resources wait for an owner: it must not grow with the verdicts (defect 5 scanned them all).
func BenchmarkACKWithManyWaiting(b *testing.B) {
	keys := []resource.Key{meshKey}
	for i := range 10_000 {
		keys = append(keys, resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: fmt.Sprintf("t-%d", i)})
	}
	w := &world{snap: snapshot(b, keys...), inventory: map[string]map[string]map[string]string{"zone-1": {}}, refreshed: map[string][]string{}}
	p := ownerpredict.New()
	h, err := owner.New(owner.Config{Policy: func() shared.OwnerCheck { return p }, Source: w, Inventory: w, Refresher: w})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	obs := h.Observer()
	obs.StreamOpened(1, "zone-1")
	deadline := time.Now().Add(10 * time.Second)
	for len(h.Held("zone-1")) < 10_000 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	ack := event.ACK{StreamID: 1, Zone: "zone-1", Kind: "MeshRetry", Versions: map[string]string{"default/x": "1"}}
	b.ResetTimer()
	for range b.N {
		obs.ACK(ack)
	}
}
