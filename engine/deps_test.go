package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// A snapshot derived from one whose index of what references each Ref is made answers
// dependents as its own index would, through chains of writes, removals and rewrites.
func TestDerivedSnapshotsKnowTheirDependents(t *testing.T) {
	g := NewWithT(t)
	r := rand.New(rand.NewPCG(1, 2))
	entry := func(name string, v int) *Entry {
		return &Entry{TypeURL: "R", Name: name, Version: fmt.Sprint(v), Refs: []Ref{{TypeURL: "C", Name: fmt.Sprintf("c%d", r.IntN(5))}}}
	}
	var put []*Entry
	for i := range 20 {
		put = append(put, entry(fmt.Sprintf("r%d", i), 0))
	}
	snap := (*Snapshot)(nil).Update(put, nil)
	snap.dependents(Ref{TypeURL: "C", Name: "c0"}) // its index made: the next ones derive theirs
	key := func(es []*Entry) []string {
		out := make([]string, 0, len(es))
		for _, e := range es {
			out = append(out, e.Name+"@"+e.Version)
		}
		slices.Sort(out)
		return out
	}
	for v := 1; v < 200; v++ {
		var put []*Entry
		removed := map[string][]string{}
		for range r.IntN(4) {
			put = append(put, entry(fmt.Sprintf("r%d", r.IntN(25)), v))
		}
		if r.IntN(3) == 0 {
			removed["R"] = []string{fmt.Sprintf("r%d", r.IntN(25))}
		}
		snap = snap.Update(put, removed)
		fresh := SnapshotOf(nil).Update(slices.Collect(func(yield func(*Entry) bool) {
			for _, e := range snap.Type("R") {
				if !yield(e) {
					return
				}
			}
		}), nil)
		for c := range 5 {
			ref := Ref{TypeURL: "C", Name: fmt.Sprintf("c%d", c)}
			g.Expect(key(snap.dependents(ref))).To(Equal(key(fresh.dependents(ref))), "write %d, %s: %s", v, ref.Name, strings.Join(key(snap.dependents(ref)), " "))
		}
	}
}
