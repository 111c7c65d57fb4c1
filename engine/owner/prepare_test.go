package owner

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// heldZones is an Inventory of zones that each hold what they are given (the same for every
// zone unless told otherwise), a Source of one snapshot and a Refresher that records.
type heldZones struct {
	mu        sync.Mutex
	snap      *engine.Snapshot
	held      map[string]map[resource.Key]string // zone -> key -> version
	published map[string]engine.View
	refreshed map[string]int
	// during runs once, when a check next reads a zone's inventory, with that zone.
	during atomic.Pointer[func(zone string)]
}

func (w *heldZones) Snapshot() *engine.Snapshot { w.mu.Lock(); defer w.mu.Unlock(); return w.snap }
func (w *heldZones) AckedVersion(zone, kind, name string) (string, bool) {
	if f := w.during.Swap(nil); f != nil {
		(*f)(zone)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	v, ok := w.held[zone][resource.KeyFromXDSName(kind, name)]
	return v, ok
}
func (w *heldZones) InventoryKeys(zone string, _ []string, _ []engine.Ref) []engine.Ref {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []engine.Ref
	for k := range w.held[zone] {
		out = append(out, engine.Ref{TypeURL: k.Kind, Name: k.XDSName()})
	}
	return out
}
func (w *heldZones) InventoryDigest(zone string) engine.Digest {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := engine.Digest{N: len(w.held[zone])}
	for k, v := range w.held[zone] {
		var h maphash.Hash
		h.SetSeed(testSeed)
		h.WriteString(k.String() + "@" + v)
		d.Sum ^= h.Sum64()
	}
	return d
}
func (*heldZones) Connected() []string { return nil }
func (w *heldZones) Refresh(zone string, _ map[string][]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refreshed[zone]++
}
func (w *heldZones) Publish(zone string, v engine.View) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.published[zone] = v
}

var testSeed = maphash.MakeSeed()

// counting is a policy that counts its Predict calls.
type counting struct {
	shared.OwnerCheck
	calls atomic.Int32
}

func (c *counting) Predict(ctx context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	c.calls.Add(1)
	return c.OwnerCheck.Predict(ctx, req)
}

// zonesAtRest is zones that each hold every Mesh of a snapshot (m1 to m5, so that a write is not
// most of it) and a policy of m1, checked in full and at rest, under Holds with a counting policy
// whose answers are shared.
func zonesAtRest(t *testing.T, zones []string) (*kds.SnapshotBuilder, *engine.Snapshot, *heldZones, *Holds, *counting) {
	t.Helper()
	b := &kds.SnapshotBuilder{}
	rs := []resource.Resource{mesh1, pol1}
	for _, n := range []string{"m2", "m3", "m4", "m5"} {
		rs = append(rs, resource.Resource{Kind: resource.MeshKind, Name: n, Generation: 1})
	}
	snap, err := b.Build(rs)
	if err != nil {
		t.Fatal(err)
	}
	w := &heldZones{snap: snap, held: map[string]map[resource.Key]string{}, published: map[string]engine.View{}, refreshed: map[string]int{}}
	for _, z := range zones {
		w.held[z] = map[resource.Key]string{}
		for _, e := range snap.Type(resource.MeshKind) {
			w.held[z][kds.KeyOf(e)] = e.Version
		}
		e := snap.Type("MeshTimeout")[pol1K.Name]
		w.held[z][kds.KeyOf(e)] = e.Version
	}
	p := &counting{OwnerCheck: ownerpredict.New()}
	h, err := New(Config{Mapping: kdsMapping, Policy: func() shared.OwnerCheck { return p }, Source: w, Inventory: w, Refresher: w, Workers: 2,
		Generation: func() uint64 { return 1 }})
	if err != nil {
		t.Fatal(err)
	}
	h.Changed(snap)
	for i, z := range zones {
		h.Observer().StreamOpened(int64(i+1), z)
	}
	synctest.Wait()
	return b, snap, w, h, p
}

// A write of a policy whose Mesh every zone holds is decided once, for every zone at rest, before
// the cache serves it: each zone's published view shows the new version at once, and Changed
// then queues no check. A zone that holds something else asks on its own; a write held back for
// a zone leaves the zones to their checks.
func TestAWriteEveryZoneAcceptsIsDecidedOnceBeforeTheCacheServesIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		zones := []string{"zone-1", "zone-2", "zone-3", "zone-4"}
		b, snap1, w, h, p := zonesAtRest(t, zones)
		defer h.Close()
		delete(w.held["zone-4"], resource.Key{Kind: resource.MeshKind, Name: "m5"}) // another inventory

		pol1v2 := pol1
		pol1v2.Generation, pol1v2.Labels = 2, map[string]string{"team": "b"} // new content, a new version
		snap2, err := b.Update([]resource.Resource{pol1v2}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		calls := p.calls.Load()
		h.Prepare(snap2)
		e2 := snap2.Type("MeshTimeout")[pol1K.Name]
		g.Expect(e2.Version).NotTo(Equal(snap1.Type("MeshTimeout")[pol1K.Name].Version))
		for _, z := range zones {
			g.Expect(w.published[z].Visible(e2)).To(BeTrue(), "%s sees the write before the cache serves it", z)
		}
		g.Expect(p.calls.Load()-calls).To(BeNumerically("<=", 2), "at most one Predict call a group: zones 1-3, and zone 4")
		w.snap = snap2
		h.Changed(snap2)
		h.mu.RLock()
		scheduled := len(h.scheduled)
		h.mu.RUnlock()
		g.Expect(scheduled).To(BeZero(), "no zone is checked again")
		synctest.Wait()
		for _, z := range zones {
			g.Expect(h.Visible(z, e2)).To(BeTrue())
		}

		// A write held back (a policy of a Mesh no zone holds): nothing is prepared, the zones'
		// checks hold it back.
		pol3 := policy("MeshTimeout", "m9", "c")
		snap3, err := b.Update([]resource.Resource{pol3}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		h.Prepare(snap3)
		e3 := snap3.Type("MeshTimeout")[pol3.Key().XDSName()]
		for _, z := range zones {
			g.Expect(w.published[z].Visible(e3)).To(BeFalse())
		}
		w.snap = snap3
		h.Changed(snap3)
		synctest.Wait()
		for _, z := range zones {
			g.Expect(h.Visible(z, e3)).To(BeFalse())
			g.Expect(h.Visible(z, e2)).To(BeTrue())
		}
	})
}

// A zone whose inventory changes while its group's write is decided is not moved by that answer
// (it was made for what the zone held before); and when the zone whose inventory the check read
// changes, no zone of the group is. Both are left to their own checks, which still show them the
// write.
func TestAZoneThatHearsSomethingWhileItsGroupIsDecidedChecksOnItsOwn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		moves func(first, other string) map[string]bool // zone -> moved by Prepare
		hears func(first, other string) string
	}{
		{name: "another zone of the group", hears: func(_, other string) string { return other },
			moves: func(first, other string) map[string]bool { return map[string]bool{first: true, other: false} }},
		{name: "the zone the check read", hears: func(first, _ string) string { return first },
			moves: func(first, other string) map[string]bool { return map[string]bool{first: false, other: false} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewWithT(t)
				zones := []string{"zone-1", "zone-2"}
				b, _, w, h, _ := zonesAtRest(t, zones)
				defer h.Close()

				pol1v2 := pol1
				pol1v2.Generation, pol1v2.Labels = 2, map[string]string{"team": "b"}
				snap2, err := b.Update([]resource.Resource{pol1v2}, nil)
				g.Expect(err).NotTo(HaveOccurred())
				e2 := snap2.Type("MeshTimeout")[pol1K.Name]
				// The zones share one group; which one the check reads is Prepare's pick.
				var first string
				heard := func(zone string) {
					first = zone
					z := tc.hears(first, otherThan(zones, first))
					w.mu.Lock()
					w.held[z][resource.Key{Kind: "MeshRetry", Mesh: "m1", Name: "r"}] = "v1"
					w.mu.Unlock()
					h.Observer().ACK(event.ACK{Node: z, TypeURL: "MeshRetry", Versions: event.VersionsOf(map[string]string{"m1/r": "v1"})})
				}
				w.during.Store(&heard)
				h.Prepare(snap2)
				g.Expect(first).NotTo(BeEmpty(), "the group was checked")
				for z, moved := range tc.moves(first, otherThan(zones, first)) {
					g.Expect(w.published[z].Visible(e2)).To(Equal(moved), "%s moved by the group's answer", z)
				}
				w.mu.Lock()
				w.snap = snap2
				w.mu.Unlock()
				h.Changed(snap2)
				synctest.Wait()
				for _, z := range zones {
					g.Expect(h.Visible(z, e2)).To(BeTrue(), "%s's own check shows it", z)
				}
			})
		})
	}
}

func otherThan(zones []string, z string) string {
	for _, o := range zones {
		if o != z {
			return o
		}
	}
	return ""
}
