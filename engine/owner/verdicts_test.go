package owner

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
)

// served builds a snapshot of rs.
func served(t *testing.T, rs ...resource.Resource) *engine.Snapshot {
	t.Helper()
	var b kds.SnapshotBuilder
	s, err := b.Build(rs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func policy(kind, mesh, name string, owners ...resource.Key) resource.Resource {
	return resource.Resource{Kind: kind, Mesh: mesh, Name: name, Owners: owners, Generation: 1}
}

var (
	mesh1  = resource.Resource{Kind: resource.MeshKind, Name: "m1", Generation: 1}
	pol1   = policy("MeshTimeout", "m1", "a")
	pol2   = policy("MeshTimeout", "m1", "b", resource.Key{Kind: "MeshRetry", Mesh: "m1", Name: "r"})
	mesh1K = ref(mesh1.Key())
	pol1K  = ref(pol1.Key())
	pol2K  = ref(pol2.Key())
)

// servedPolicies is a snapshot of mesh1, pol1 and pol2, and the version it serves of a key.
func servedPolicies(t *testing.T) (*engine.Snapshot, func(engine.Ref) string) {
	snap := served(t, mesh1, pol1, pol2)
	return snap, func(k engine.Ref) string { return snap.Type(k.TypeURL)[k.Name].Version }
}

// layered is a zone whose verdicts are own, then a table of table (nil: none), then snap.
func layered(own, table Verdicts, snap *engine.Snapshot) *nodeHolds {
	z := &nodeHolds{own: ownOf(own), base: snap}
	if table != nil {
		z.table = newTable(table, snap, &kdsMapping)
	}
	return z
}

func wait(k engine.Ref, version, owner string) Verdict {
	return Verdict{Version: version, Withheld: &Withheld{Key: k, Verdict: Wait, WaitingFor: refOf(owner)}}
}

func reject(k engine.Ref, version string) Verdict {
	return Verdict{Version: version, Withheld: &Withheld{Key: k, Verdict: Reject}}
}

// The first layer that knows a key wins: own, then the table, then the base snapshot.
func TestZoneVerdictLayers(t *testing.T) {
	snap, v := servedPolicies(t)
	absent := ref(resource.Key{Kind: "MeshTimeout", Mesh: "m1", Name: "gone"})
	for _, tc := range []struct {
		name        string
		own         Verdicts
		table       Verdicts
		key         engine.Ref
		want        Verdict
		wantKnown   bool
		wantVisible string
	}{
		{name: "base only: accepted at the snapshot's version", key: pol1K, want: Verdict{Version: v(pol1K)}, wantKnown: true, wantVisible: v(pol1K)},
		{name: "the table holds it back", table: Verdicts{pol1K: wait(pol1K, v(pol1K), "Mesh/m1")}, key: pol1K, want: wait(pol1K, v(pol1K), "Mesh/m1"), wantKnown: true},
		{name: "own over the table", own: Verdicts{pol1K: {Version: v(pol1K)}}, table: Verdicts{pol1K: wait(pol1K, v(pol1K), "Mesh/m1")}, key: pol1K, want: Verdict{Version: v(pol1K)}, wantKnown: true, wantVisible: v(pol1K)},
		{name: "own over the base", own: Verdicts{pol1K: reject(pol1K, v(pol1K))}, key: pol1K, want: reject(pol1K, v(pol1K)), wantKnown: true},
		{name: "own without version: no longer served, never visible", own: Verdicts{pol1K: {}}, key: pol1K, want: Verdict{}, wantKnown: true},
		{name: "another key's verdicts say nothing of this one", own: Verdicts{pol1K: reject(pol1K, v(pol1K))}, table: Verdicts{mesh1K: reject(mesh1K, v(mesh1K))}, key: pol2K, want: Verdict{Version: v(pol2K)}, wantKnown: true, wantVisible: v(pol2K)},
		{name: "in no layer", key: absent, want: Verdict{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			z := layered(tc.own, tc.table, snap)
			got, known := z.verdict(tc.key)
			g.Expect(got).To(Equal(tc.want))
			g.Expect(known).To(Equal(tc.wantKnown))
			g.Expect(z.VisibleVersion(tc.key)).To(Equal(tc.wantVisible))
		})
	}
}

// A held verdict is indexed under what it waits for and every owner its entry names; setOwn
// keeps own's index as verdicts replace each other, and an accepted verdict is under nothing.
func TestOwnWaitingIndex(t *testing.T) {
	snap := served(t, mesh1, pol1, pol2)
	e1, e2 := snap.Type(pol1K.TypeURL)[pol1K.Name], snap.Type(pol2K.TypeURL)[pol2K.Name]
	type set = map[engine.Ref][]engine.Ref
	for _, tc := range []struct {
		name string
		set  func(z *nodeHolds)
		want set
	}{
		{
			name: "a WAIT for its Mesh: under the Mesh once",
			set:  func(z *nodeHolds) { z.setOwn(pol1K, wait(pol1K, e1.Version, "Mesh/m1"), ownersOf(e1)) },
			want: set{refOf("Mesh/m1"): {pol1K}},
		},
		{
			name: "a REJECT: under its Mesh and its explicit owner",
			set:  func(z *nodeHolds) { z.setOwn(pol2K, reject(pol2K, e2.Version), ownersOf(e2)) },
			want: set{refOf("Mesh/m1"): {pol2K}, refOf("MeshRetry/m1/r"): {pol2K}},
		},
		{
			name: "a WAIT for something it does not name: under that too",
			set:  func(z *nodeHolds) { z.setOwn(pol1K, wait(pol1K, e1.Version, "Mesh/other"), ownersOf(e1)) },
			want: set{refOf("Mesh/other"): {pol1K}, refOf("Mesh/m1"): {pol1K}},
		},
		{
			name: "accepted later: under nothing",
			set: func(z *nodeHolds) {
				z.setOwn(pol2K, reject(pol2K, e2.Version), ownersOf(e2))
				z.setOwn(pol2K, Verdict{Version: e2.Version}, ownersOf(e2))
			},
			want: set{},
		},
		{
			name: "no longer served: under nothing",
			set: func(z *nodeHolds) {
				z.setOwn(pol1K, wait(pol1K, e1.Version, "Mesh/m1"), ownersOf(e1))
				z.setOwn(pol1K, Verdict{}, nil)
			},
			want: set{},
		},
		{
			name: "two under one owner, one leaves",
			set: func(z *nodeHolds) {
				z.setOwn(pol1K, wait(pol1K, e1.Version, "Mesh/m1"), ownersOf(e1))
				z.setOwn(pol2K, wait(pol2K, e2.Version, "MeshRetry/m1/r"), ownersOf(e2))
				z.setOwn(pol1K, Verdict{Version: e1.Version}, ownersOf(e1))
			},
			want: set{refOf("Mesh/m1"): {pol2K}, refOf("MeshRetry/m1/r"): {pol2K}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			z := &nodeHolds{ownWaiting: map[engine.Ref]map[engine.Ref]bool{}, ownOwners: map[engine.Ref][]engine.Ref{}, base: snap}
			tc.set(z)
			got := set{}
			for o, keys := range z.ownWaiting {
				g.Expect(keys).NotTo(BeEmpty(), "no empty set is kept")
				got[o] = slices.SortedFunc(maps.Keys(keys), compareKeys)
			}
			g.Expect(got).To(Equal(tc.want))
			for k, under := range z.ownOwners {
				for _, o := range under {
					g.Expect(z.ownWaiting[o]).To(HaveKey(k))
				}
			}

			// A table of the same verdicts is indexed the same.
			held := Verdicts{}
			z.own.each(func(k engine.Ref, v Verdict) {
				if v.Withheld != nil {
					held[k] = v
				}
			})
			table := set{}
			for o, keys := range newTable(held, snap, &kdsMapping).waiting {
				table[o] = slices.SortedFunc(slices.Values(keys), compareKeys)
			}
			g.Expect(table).To(Equal(tc.want))
		})
	}
}

func compareKeys(a, b engine.Ref) int {
	return cmp.Or(strings.Compare(a.TypeURL, b.TypeURL), strings.Compare(a.Name, b.Name))
}

// addWaiting adds what waits for an owner to the zone's work, or, once that and the work already
// there are half the snapshot or more, a full check instead.
func TestAddWaitingThresholds(t *testing.T) {
	waiting := func(n int) map[engine.Ref]bool {
		out := map[engine.Ref]bool{}
		for i := range n {
			out[ref(resource.Key{Kind: "MeshTimeout", Mesh: "m1", Name: fmt.Sprint("w-", i)})] = true
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		own       int // own verdicts waiting for Mesh/m1
		table     int // table verdicts waiting for it
		work      int // keys already in the work
		full      bool
		snapLen   int
		wantFound bool
		wantFull  bool
		wantKeys  int
	}{
		{name: "nothing waits", snapLen: 100, work: 3, wantKeys: 3},
		{name: "a few wait in own", own: 3, snapLen: 100, wantFound: true, wantKeys: 3},
		{name: "own and the table", own: 2, table: 5, snapLen: 100, wantFound: true, wantKeys: 7},
		{name: "just under half of the snapshot", own: 20, table: 19, work: 10, snapLen: 100, wantFound: true, wantKeys: 49},
		{name: "half of the snapshot: a full check", own: 20, table: 20, work: 10, snapLen: 100, wantFound: true, wantFull: true},
		{name: "a full check pending already", own: 3, full: true, snapLen: 100, wantFound: true, wantFull: true},
		{name: "a full check pending, nothing waits", full: true, snapLen: 100, wantFull: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			z := &nodeHolds{ownWaiting: map[engine.Ref]map[engine.Ref]bool{}}
			if tc.own > 0 {
				z.ownWaiting[refOf("Mesh/m1")] = waiting(tc.own)
			}
			var tableKeys []engine.Ref
			for i := range tc.table {
				tableKeys = append(tableKeys, ref(resource.Key{Kind: "MeshRetry", Mesh: "m1", Name: fmt.Sprint("t-", i)}))
			}
			z.table = &table{waiting: map[engine.Ref][]engine.Ref{refOf("Mesh/m1"): tableKeys}}
			z.full = tc.full
			for i := range tc.work {
				z.addWork(ref(resource.Key{Kind: "MeshRetry", Mesh: "m1", Name: fmt.Sprint("work-", i)}))
			}
			g.Expect(z.addWaiting(refOf("Mesh/m1"), tc.snapLen)).To(Equal(tc.wantFound))
			g.Expect(z.full).To(Equal(tc.wantFull))
			g.Expect(z.keys).To(HaveLen(tc.wantKeys))
			g.Expect(z.addWaiting(refOf("Mesh/other"), tc.snapLen)).To(BeFalse(), "nothing waits for another owner")
		})
	}
}

// Kept per write, the index of the snapshot's entries by owner is the one made from scratch.
func TestDependentsKeptPerWrite(t *testing.T) {
	g := NewWithT(t)
	rnd := rand.New(rand.NewPCG(7, 7))
	key := func() resource.Key {
		if rnd.IntN(4) == 0 {
			return resource.Key{Kind: resource.MeshKind, Name: fmt.Sprint("m", rnd.IntN(2))}
		}
		return resource.Key{Kind: "MeshTimeout", Mesh: fmt.Sprint("m", rnd.IntN(2)), Name: fmt.Sprint("p", rnd.IntN(4))}
	}
	var b kds.SnapshotBuilder
	prev, err := b.Update(nil, nil)
	g.Expect(err).NotTo(HaveOccurred())
	d := dependentsOf(prev, &kdsMapping)
	generation := map[resource.Key]int64{}
	for step := range 300 {
		k := key()
		var changed []resource.Resource
		var deleted []resource.Key
		if generation[k] > 0 && rnd.IntN(3) == 0 {
			deleted = append(deleted, k)
			delete(generation, k)
		} else {
			generation[k]++
			r := resource.Resource{Kind: k.Kind, Mesh: k.Mesh, Name: k.Name, Generation: generation[k]}
			if k.Kind != resource.MeshKind && rnd.IntN(2) == 0 {
				r.Owners = []resource.Key{key()}
			}
			changed = append(changed, r)
		}
		snap, err := b.Update(changed, deleted)
		g.Expect(err).NotTo(HaveOccurred())
		if diff, ok := snap.ChangesFrom(prev); ok {
			d.update(prev, snap, diff, &kdsMapping)
		}
		g.Expect(d).To(Equal(dependentsOf(snap, &kdsMapping)), "step %d", step)
		prev = snap
	}
}
