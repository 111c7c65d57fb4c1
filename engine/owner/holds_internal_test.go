package owner

import (
	"sync/atomic"
	"testing"
	"testing/synctest"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	"github.com/kds-host/kds-host/shared"
)

// Withheld lists a zone's held verdicts, own over the table's, sorted by key; accepted verdicts and
// verdicts of what is no longer served are not listed.
func TestHeldOrderAndLayers(t *testing.T) {
	snap, v := servedPolicies(t)
	other := ref(resource.Key{Kind: "MeshRetry", Mesh: "m1", Name: "a"})
	for _, tc := range []struct {
		name  string
		own   Verdicts
		table Verdicts
		want  []engine.Ref
	}{
		{name: "nothing held"},
		{name: "the table's, sorted", table: Verdicts{pol2K: reject(pol2K, v(pol2K)), pol1K: wait(pol1K, v(pol1K), "Mesh/m1"), other: reject(other, "1")}, want: []engine.Ref{other, pol1K, pol2K}},
		{name: "own accepts one of the table's", own: Verdicts{pol1K: {Version: v(pol1K)}}, table: Verdicts{pol1K: wait(pol1K, v(pol1K), "Mesh/m1"), pol2K: reject(pol2K, v(pol2K))}, want: []engine.Ref{pol2K}},
		{name: "own holds back, the table had it accepted", own: Verdicts{mesh1K: reject(mesh1K, v(mesh1K)), pol1K: {}}, table: Verdicts{pol2K: reject(pol2K, v(pol2K))}, want: []engine.Ref{mesh1K, pol2K}},
		{name: "own replaces the table's verdict", own: Verdicts{pol2K: wait(pol2K, v(pol2K), "MeshRetry/m1/r")}, table: Verdicts{pol2K: reject(pol2K, v(pol2K))}, want: []engine.Ref{pol2K}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			z := layered(tc.own, tc.table, snap)
			h := &Holds{nodes: map[string]*nodeHolds{"zone-1": z}}
			var got []engine.Ref
			for _, held := range h.Withheld("zone-1") {
				got = append(got, held.Key)
				if own, ok := tc.own[held.Key]; ok {
					g.Expect(held).To(Equal(*own.Withheld), "own's verdict wins")
				}
			}
			g.Expect(got).To(Equal(tc.want))
			g.Expect(h.Withheld("zone-2")).To(BeEmpty(), "an unknown zone holds nothing back")
		})
	}
}

// Forget frees a zone only once its last stream closed, and a zone back after Forget starts
// from nothing.
func TestForget(t *testing.T) {
	for _, tc := range []struct {
		name      string
		streams   func(h *Holds)
		wantZones int
	}{
		{name: "an open zone is kept", streams: func(h *Holds) { h.Observer().StreamOpened(1, "zone-1") }, wantZones: 1},
		{name: "a closed zone is freed", streams: func(h *Holds) {
			h.Observer().StreamOpened(1, "zone-1")
			h.Observer().StreamClosed(1, "zone-1")
		}},
		{name: "the close of a replaced stream frees nothing", streams: func(h *Holds) {
			h.Observer().StreamOpened(1, "zone-1")
			h.Observer().StreamOpened(2, "zone-1")
			h.Observer().StreamClosed(1, "zone-1")
		}, wantZones: 1},
		{name: "an unknown zone: nothing to free", streams: func(*Holds) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewWithT(t)
				snap := served(t, mesh1)
				h := newTestHolds(t, snap, ownerpredict.New())
				h.Changed(snap)
				tc.streams(h)
				synctest.Wait()
				h.Forget("zone-1")
				g.Expect(h.Nodes()).To(Equal(tc.wantZones))
				e := snap.Type(resource.MeshKind)["m1"]
				g.Expect(h.Visible("zone-1", e)).To(Equal(tc.wantZones == 1))
				if tc.wantZones == 0 {
					_, none, release := h.View("zone-1")
					release()
					g.Expect(none).To(BeTrue(), "a forgotten zone sees nothing")
				}
			})
		})
	}
}

// emptyZones is an Inventory of zones that hold nothing, a Source of one snapshot and a
// Refresher that counts.
type emptyZones struct {
	snap      *engine.Snapshot
	refreshes atomic.Int32
}

func (e *emptyZones) Snapshot() *engine.Snapshot                       { return e.snap }
func (*emptyZones) AckedVersion(string, string, string) (string, bool) { return "", false }
func (*emptyZones) InventoryKeys(string, []string, []engine.Ref) []engine.Ref {
	return nil
}
func (*emptyZones) InventoryDigest(string) engine.Digest  { return engine.Digest{} }
func (*emptyZones) Connected() []string                   { return nil }
func (e *emptyZones) Refresh(string, map[string][]string) { e.refreshes.Add(1) }
func (e *emptyZones) Publish(string, engine.View)         {}

func newTestHolds(t *testing.T, snap *engine.Snapshot, p shared.OwnerCheck) *Holds {
	t.Helper()
	w := &emptyZones{snap: snap}
	h, err := New(Config{Mapping: kdsMapping, Policy: func() shared.OwnerCheck { return p }, Source: w, Inventory: w, Refresher: w, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// A write that every zone may see moves the zone's base to the new snapshot instead of adding a
// verdict of its own, so zones that decided the same keep sharing; a write held back is the
// zone's own verdict, over the base it had.
func TestAnAcceptedWriteMovesTheBaseInsteadOfAddingOwnVerdicts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		var b kds.SnapshotBuilder
		// Other Meshes, so that a check of one or two keys is not most of the snapshot (that is a
		// full check).
		rs := []resource.Resource{mesh1}
		for _, n := range []string{"m2", "m3", "m4", "m5"} {
			rs = append(rs, resource.Resource{Kind: resource.MeshKind, Name: n, Generation: 1})
		}
		snap1, err := b.Build(rs)
		g.Expect(err).NotTo(HaveOccurred())
		h := newTestHolds(t, snap1, ownerpredict.New())
		h.Changed(snap1)
		h.Observer().StreamOpened(1, "zone-1")
		synctest.Wait()
		layers := func() (own int, base *engine.Snapshot) {
			h.mu.RLock()
			defer h.mu.RUnlock()
			z := h.nodes["zone-1"]
			return z.own.len(), z.base
		}

		mesh1v2 := mesh1
		mesh1v2.Generation = 2
		snap2, err := b.Update([]resource.Resource{mesh1v2}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		h.Changed(snap2)
		synctest.Wait()
		own, base := layers()
		g.Expect(own).To(BeZero(), "an accepted write is no verdict of the zone's own")
		g.Expect(base).To(BeIdenticalTo(snap2))
		g.Expect(h.Visible("zone-1", snap2.Type(resource.MeshKind)["m1"])).To(BeTrue(), "the new version is visible")

		// The zone does not hold m1: a policy in it waits for its Mesh.
		snap3, err := b.Update([]resource.Resource{pol1}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		h.Changed(snap3)
		synctest.Wait()
		own, base = layers()
		g.Expect(own).To(BeNumerically(">", 0), "a write held back is the zone's own verdict")
		g.Expect(base).To(BeIdenticalTo(snap2), "over the base it had")
		g.Expect(h.Visible("zone-1", snap3.Type("MeshTimeout")[pol1K.Name])).To(BeFalse())
		g.Expect(h.Visible("zone-1", snap3.Type(resource.MeshKind)["m1"])).To(BeTrue())

		// Deleting the held policy again: the zone has own verdicts, so they stay its own.
		snap4, err := b.Update(nil, []resource.Key{pol1.Key()})
		g.Expect(err).NotTo(HaveOccurred())
		h.Changed(snap4)
		synctest.Wait()
		own, base = layers()
		g.Expect(own).To(BeNumerically(">", 0))
		g.Expect(base).To(BeIdenticalTo(snap2))
		g.Expect(h.Withheld("zone-1")).To(BeEmpty(), "nothing is held back once the policy is gone")
	})
}
