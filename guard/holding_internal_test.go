package guard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
)

// What a client holds, kept as a shared served's map and what differs from it, or as a map of
// its own, is what one plain map would be after any sequence of edits: accepting a name or
// forgetting it, holding everything a served holds, settling on a served or not. What differs
// never repeats the base, and a map of its own holds no nil. What references a name (its
// referrer, from the holding's index) is what a walk of that map finds first by name.
func TestAHoldingIsWhatOneMapWouldBe(t *testing.T) {
	g := NewWithT(t)
	rng := rand.New(rand.NewPCG(24, 1))
	var names []string
	for i := range 200 {
		names = append(names, fmt.Sprintf("n%03d", i))
	}
	var refs []Ref
	for i := range 7 {
		refs = append(refs, Ref{TypeURL: resource.EndpointType, Name: fmt.Sprintf("e%d", i)})
	}
	pool := map[string][]*item{}
	for i, n := range names {
		// Each version references other names, or none.
		pool[n] = append(pool[n], &item{name: n, version: "1", refs: []Ref{refs[i%7]}},
			&item{name: n, version: "2", refs: []Ref{refs[i%5], refs[(i+2)%5]}}, &item{name: n, version: "3"})
	}
	// servedOf is a shared served of the names (each at a random version of the pool's).
	servedOf := func(names []string) *served {
		var items []*item
		for _, n := range names {
			items = append(items, pool[n][rng.IntN(3)])
		}
		return (*served)(nil).fold(resource.ClusterType, items, "v", nil, false)
	}
	var h holding
	want := map[string]*item{}
	settled := 0
	for step := range 10000 {
		n := names[rng.IntN(len(names))]
		switch op := rng.IntN(100); {
		case op < 85: // an answer accepts a version, or a removal
			var it *item
			if rng.IntN(5) > 0 {
				it = pool[n][rng.IntN(3)]
			}
			h.set(n, it)
			if it == nil {
				delete(want, n)
			} else {
				want[n] = it
			}
		case op < 88: // everything a served holds, and nothing else
			sv := servedOf(names[:100+rng.IntN(100)])
			h.holdServed(sv)
			want = map[string]*item{}
			for _, it := range sv.sorted {
				want[it.name] = it
			}
		case op < 89:
			h.own(rng.IntN(10))
			want = map[string]*item{}
		default: // settle, on what it holds as a served, or on another
			var sv *served
			switch rng.IntN(4) {
			case 0: // what it holds
				var items []*item
				for _, it := range want {
					items = append(items, it)
				}
				sv = (*served)(nil).fold(resource.ClusterType, items, "v", nil, false)
			case 1: // the names it holds, at other versions maybe
				var held []string
				for n := range want {
					held = append(held, n)
				}
				sv = servedOf(held)
			case 2:
				sv = servedOf(names[:150])
			}
			base := h.base
			h.settle(sv)
			if base != nil && h.base != nil && !sameMap(base, h.base) {
				settled++
			}
		}
		g.Expect(held(&h)).To(Equal(want), "step %d", step)
		g.Expect(h.len()).To(Equal(len(want)), "step %d", step)
		for _, k := range names {
			if h.get(k) != want[k] {
				t.Fatalf("step %d: get(%s) is %v, want %v", step, k, h.get(k), want[k])
			}
		}
		if step%3 == 0 {
			ref := refs[rng.IntN(len(refs))]
			first, found := "", false
			for n, it := range want {
				if slices.Contains(it.refs, ref) && (!found || n < first) {
					first, found = n, true
				}
			}
			by, ok := h.referrer(ref)
			g.Expect(ok).To(Equal(found), "step %d: referrer of %v", step, ref)
			g.Expect(by).To(Equal(first), "step %d: referrer of %v", step, ref)
		}
		for k, it := range h.over {
			if h.base == nil {
				g.Expect(it).NotTo(BeNil(), "step %d: a map of its own holds %s as nil", step, k)
			} else {
				g.Expect(it).NotTo(BeIdenticalTo(h.base[k]), "step %d: %s differs for nothing", step, k)
			}
		}
	}
	g.Expect(settled).To(BeNumerically(">", 10), "settling on a served was tried")
}
