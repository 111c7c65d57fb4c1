package engine

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/kds-host/kds-host/host/resource"
)

// delivered is a map of name -> Resource, whatever its base and however often it is rebased:
// random sets, drops and rebases onto snapshots derived from one another, checked after each
// step against a plain map. And a stream that holds what is served ends with no map of its own.
func TestDeliveredIsAMapWhateverItsBase(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var rebased, shared, advanced int
	for round := range 200 {
		var b testSnapshots
		names := []string{"m1", "m2", "m3", "m4", "m5", "m6"}
		gen := map[string]int64{}
		var rs []resource.Resource
		for _, n := range names[:3] {
			gen[n] = 1
			rs = append(rs, resource.Resource{Kind: resource.MeshKind, Name: n, Generation: 1})
		}
		snap, err := b.Build(rs)
		if err != nil {
			t.Fatal(err)
		}
		var d delivered
		want := map[string]*discovery.Resource{}
		for step := range 40 {
			switch op := rng.IntN(7); op {
			case 0: // the snapshot moves on
				n := names[rng.IntN(len(names))]
				if rng.IntN(3) == 0 {
					snap, err = b.Update(nil, []resource.Key{{Kind: resource.MeshKind, Name: n}})
				} else {
					gen[n]++
					snap, err = b.Update([]resource.Resource{{Kind: resource.MeshKind, Name: n, Generation: gen[n]}}, nil)
				}
				if err != nil {
					t.Fatal(err)
				}
			case 1, 2: // sent what is served
				for n, e := range snap.Type(resource.MeshKind) {
					if rng.IntN(2) == 0 || op == 2 {
						d.set(n, e.Wire)
						want[n] = e.Wire
					}
				}
				if op == 2 {
					for n := range want {
						if snap.Type(resource.MeshKind)[n] == nil {
							d.drop(n)
							delete(want, n)
						}
					}
				}
			case 3: // a version not served (the zone's initial versions)
				n := names[rng.IntN(len(names))]
				r := versionOnly(n, fmt.Sprint("v", step))
				d.set(n, r)
				want[n] = r
			case 4:
				n := names[rng.IntN(len(names))]
				d.drop(n)
				delete(want, n)
			case 5:
				d.rebase(snap, resource.MeshKind)
				if d.snap == snap {
					rebased++
				}
			case 6: // sent what changed since d's base (or, when there is no lineage, one name)
				ch, _ := snap.ChangesFrom(d.snap)
				changed := ch[resource.MeshKind]
				if len(changed) == 0 {
					changed = names[rng.IntN(len(names)):][:1]
				}
				var rs []*discovery.Resource
				var removed []string
				for _, n := range changed {
					if e := snap.Type(resource.MeshKind)[n]; e != nil {
						rs = append(rs, e.Wire)
					} else if _, held := want[n]; held {
						removed = append(removed, n)
					}
				}
				if d.advance(snap, resource.MeshKind, rs, removed) {
					advanced++
				} else {
					for _, r := range rs {
						d.set(r.Name, r)
					}
					for _, n := range removed {
						d.drop(n)
					}
				}
				for _, r := range rs {
					want[r.Name] = r
				}
				for _, n := range removed {
					delete(want, n)
				}
			}
			got := map[string]*discovery.Resource{}
			d.each(func(n string, r *discovery.Resource) {
				if _, dup := got[n]; dup {
					t.Fatalf("round %d step %d: each gave %s twice", round, step, n)
				}
				got[n] = r
			})
			if !maps.Equal(got, want) || d.len() != len(want) {
				t.Fatalf("round %d step %d: delivered holds %v (len %d), want %v", round, step, got, d.len(), want)
			}
			for _, n := range names {
				r, ok := d.get(n)
				if w, wok := want[n]; r != w || ok != wok {
					t.Fatalf("round %d step %d: get(%s) = %v, %v; want %v, %v", round, step, n, r, ok, w, wok)
				}
			}
		}
		// In sync with what is served: no map of its own once rebased.
		for n, e := range snap.Type(resource.MeshKind) {
			d.set(n, e.Wire)
		}
		for _, n := range names {
			if snap.Type(resource.MeshKind)[n] == nil {
				d.drop(n)
			}
		}
		d.rebase(snap, resource.MeshKind)
		if d.snap == snap && len(d.over) == 0 {
			shared++
		}
	}
	if rebased == 0 || shared == 0 || advanced == 0 {
		t.Fatalf("rebased %d times, advanced %d, shared at the end %d times: the rebase was never exercised", rebased, advanced, shared)
	}
	t.Logf("rebased %d times, advanced %d; in sync and shared at the end in %d of 200 rounds", rebased, advanced, shared)
}

// A first response that is exactly the kind's entries is held as the snapshot's, with no map;
// any other is not.
func TestAFirstResponseOfEverythingSharesTheSnapshots(t *testing.T) {
	var b testSnapshots
	snap, err := b.Build([]resource.Resource{{Kind: resource.MeshKind, Name: "m1", Generation: 1}, {Kind: resource.MeshKind, Name: "m2", Generation: 1}})
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := snap.Type(resource.MeshKind)["m1"].Wire, snap.Type(resource.MeshKind)["m2"].Wire
	var d delivered
	if d.sentAll(snap, resource.MeshKind, []*discovery.Resource{m1}) {
		t.Fatal("one of two entries taken for all of them")
	}
	if d.sentAll(snap, resource.MeshKind, []*discovery.Resource{m1, versionOnly("m2", "other")}) {
		t.Fatal("a version the snapshot does not serve taken for its entry")
	}
	if !d.sentAll(snap, resource.MeshKind, []*discovery.Resource{m1, m2}) || d.len() != 2 || d.over != nil {
		t.Fatalf("every entry: want the snapshot's, no map; got len %d, over %v", d.len(), d.over)
	}
	if r, ok := d.get("m2"); !ok || r != m2 {
		t.Fatalf("get(m2) = %v, %v", r, ok)
	}
	if d.sentAll(snap, resource.MeshKind, []*discovery.Resource{m1, m2}) {
		t.Fatal("sentAll on a delivered that holds something")
	}
}

// priorSet is a map of name -> version, in its slice and past it.
func TestPriorSetIsAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var p priorSet
	want := map[string]string{}
	for step := range 2000 {
		n := fmt.Sprint("n", rng.IntN(20))
		if rng.IntN(3) == 0 {
			p.del(n)
			delete(want, n)
		} else {
			v := fmt.Sprint("v", step)
			p.set(n, v)
			want[n] = v
		}
		got := map[string]string{}
		p.each(func(n string) {
			v, ok := p.get(n)
			if !ok {
				t.Fatalf("step %d: each gave %s, get does not have it", step, n)
			}
			got[n] = v
		})
		if !maps.Equal(got, want) {
			t.Fatalf("step %d: %v, want %v", step, got, want)
		}
		if _, ok := p.get("absent"); ok {
			t.Fatal("get of an absent name")
		}
	}
}
