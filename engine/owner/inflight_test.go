package owner_test

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/owner"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// Checks in flight: what happens to a zone while its policy call is out.

// gate holds the checks' Predict calls while it is shut, so that the steps meanwhile happen
// while checks are in flight.
type gate struct {
	mu     sync.Mutex
	closed chan struct{} // nil: open
	calls  int           // Predict calls so far
}

func (g *gate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = make(chan struct{})
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.closed)
	g.closed = nil
}

func (g *gate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}

func (g *gate) isShut() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed != nil
}

// gated is a policy whose Predict calls wait at the gate.
type gated struct {
	shared.OwnerCheck
	gate *gate
}

func (p gated) Predict(ctx context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	p.gate.mu.Lock()
	closed := p.gate.closed
	p.gate.calls++
	p.gate.mu.Unlock()
	if closed != nil {
		select {
		case <-closed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return p.OwnerCheck.Predict(ctx, req)
}

// Found by the model: a zone that reports holding a resource at its version while its check is
// in flight sees it once the check ends (a resource held at its version is accepted), though
// the check, which read the inventory before the report, held it back.
func TestAReportDuringACheckIsWeighedAfterIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		m1 := resource.Key{Kind: resource.MeshKind, Name: "m1"}
		pol := resource.Key{Kind: "MeshTimeout", Mesh: "m1", Name: "a"}
		w := &world{snap: snapshot(t, m1, pol), inventory: map[string]map[string]map[string]string{"zone-1": {}}, refreshed: map[string][]string{}}
		p := gated{ownerpredict.New(), &gate{}}
		h, err := owner.New(owner.Config{Mapping: owner.KDSMapping, Policy: func() shared.OwnerCheck { return p }, Source: w, Inventory: w, Refresher: w, Timeout: time.Hour})
		g.Expect(err).NotTo(HaveOccurred())
		defer h.Close()
		h.Changed(w.snap)

		p.gate.shut()
		h.Observer().StreamOpened(1, "zone-1")
		synctest.Wait() // the check waits at the gate
		versions := map[string]string{pol.XDSName(): version(w.snap, pol)}
		w.store("zone-1", pol.Kind, versions, nil)
		h.Observer().ACK(event.ACK{StreamID: 1, Node: "zone-1", TypeURL: pol.Kind, Versions: event.VersionsOf(versions), Initial: true})
		p.gate.open()
		synctest.Wait()

		g.Expect(h.Visible("zone-1", w.snap.Type(pol.Kind)[pol.XDSName()])).To(BeTrue(), "held at its version: accepted")
		g.Expect(h.Withheld("zone-1")).To(BeEmpty())
	})
}

// A zone that gets work while it is checked is not checked a second time at once, but again
// when its check ends.
func TestWorkDuringACheckIsCheckedAfterIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		m1 := resource.Key{Kind: resource.MeshKind, Name: "m1"}
		pol := resource.Resource{Kind: "MeshTimeout", Mesh: "m1", Name: "a", Generation: 1}
		var b kds.SnapshotBuilder
		snap, err := b.Update([]resource.Resource{{Kind: m1.Kind, Name: m1.Name, Generation: 1}, pol}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		w := &world{snap: snap, inventory: map[string]map[string]map[string]string{"zone-1": {}}, refreshed: map[string][]string{}}
		p := gated{ownerpredict.New(), &gate{}}
		h, err := owner.New(owner.Config{Mapping: owner.KDSMapping, Policy: func() shared.OwnerCheck { return p }, Source: w, Inventory: w, Refresher: w, Workers: 2, Timeout: time.Hour})
		g.Expect(err).NotTo(HaveOccurred())
		defer h.Close()
		h.Changed(snap)
		p.gate.shut()
		h.Observer().StreamOpened(1, "zone-1")
		synctest.Wait()
		g.Expect(p.gate.count()).To(Equal(1), "the first check waits at the gate")

		// A write while the zone is checked: the other worker does not take the zone.
		pol.Generation = 2
		snap2, err := b.Update([]resource.Resource{pol}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		w.serve(snap2)
		h.Changed(snap2)
		synctest.Wait()
		g.Expect(p.gate.count()).To(Equal(1), "no second check of the zone at once")

		p.gate.open()
		synctest.Wait()
		g.Expect(p.gate.count()).To(Equal(2), "checked again once the first check ended")
		e := snap2.Type(pol.Kind)[pol.Key().XDSName()]
		g.Expect(h.Visible("zone-1", e)).To(BeFalse(), "the new version waits for its Mesh")
		g.Expect(h.Withheld("zone-1")).To(ConsistOf(HaveField("Key", kds.RefOf(pol.Key()))))
	})
}

// digestTaken is a world that calls taken once, right after a check read the zone's inventory
// digest and before it reads the inventory itself.
type digestTaken struct {
	*world
	taken atomic.Pointer[func()]
}

func (w *digestTaken) InventoryDigest(zone string) engine.Digest {
	d := w.world.InventoryDigest(zone)
	if f := w.taken.Swap(nil); f != nil {
		(*f)()
	}
	return d
}

// Found by the model (once, under load): a zone whose stream reopens right after its check read
// its inventory's digest, and which reports what it held again while the check is in flight,
// holds the same as when the check began: the digest is the same at both ends of the check,
// though the check read the empty inventory in between. Its answer (a REJECT for a resource the
// zone holds, its Mesh being served nowhere) is not shared: the full check the new stream asks
// for decides again from what the zone holds, and accepts it.
func TestAnAnswerFromAnInventoryThatMovedMeanwhileIsNotShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		pol := resource.Key{Kind: "MeshTimeout", Mesh: "m1", Name: "a"} // its Mesh m1 is gone
		m2 := resource.Key{Kind: resource.MeshKind, Name: "m2"}
		snap := snapshot(t, m2, pol)
		held := map[string]string{pol.XDSName(): version(snap, pol)}
		w := &digestTaken{world: &world{snap: snap, inventory: map[string]map[string]map[string]string{"zone-1": {pol.Kind: maps.Clone(held)}}, refreshed: map[string][]string{}}}
		p := gated{ownerpredict.New(), &gate{}} // zone independent: its answers are shared
		h, err := owner.New(owner.Config{Mapping: owner.KDSMapping, Policy: func() shared.OwnerCheck { return p }, Source: w, Inventory: w, Refresher: w,
			Generation: func() uint64 { return 1 }, Timeout: time.Hour})
		g.Expect(err).NotTo(HaveOccurred())
		defer h.Close()
		h.Changed(snap)

		p.gate.shut()
		reopen := func() {
			w.empty("zone-1") // a new stream starts from nothing
			h.Observer().StreamOpened(2, "zone-1")
		}
		w.taken.Store(&reopen)
		h.Observer().StreamOpened(1, "zone-1")
		synctest.Wait() // the check read the empty inventory, and waits at the gate
		g.Expect(p.gate.count()).To(Equal(1))

		// Stream 2 reports what the zone holds: the same as when the check began.
		w.store("zone-1", pol.Kind, held, nil)
		h.Observer().ACK(event.ACK{StreamID: 2, Node: "zone-1", TypeURL: pol.Kind, Versions: event.VersionsOf(held), Initial: true})
		p.gate.open()
		synctest.Wait()

		g.Expect(h.Visible("zone-1", snap.Type(pol.Kind)[pol.XDSName()])).To(BeTrue(), "held at its version: accepted")
		g.Expect(h.Withheld("zone-1")).To(BeEmpty())
	})
}
