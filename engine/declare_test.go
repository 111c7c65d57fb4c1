package engine

import (
	"testing"
	"testing/synctest"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
)

// A snapshot has a type it has entries of, or one it declares (Declare) although it has none;
// a declared snapshot keeps a type that an update empties, where another drops it.
func TestASnapshotHasTheTypesItHasEntriesOfOrDeclares(t *testing.T) {
	a, b := &Entry{TypeURL: "A", Name: "a", Version: "1"}, &Entry{TypeURL: "B", Name: "b", Version: "1"}
	for _, tc := range []struct {
		name  string
		snap  *Snapshot
		has   []string // sorted
		lacks []string
		len   int
	}{
		{name: "none", snap: nil, lacks: []string{"A"}},
		{name: "of entries", snap: SnapshotOf([]*Entry{a}), has: []string{"A"}, lacks: []string{"B"}, len: 1},
		{name: "declared, without entries", snap: SnapshotOf(nil).Declare("A"), has: []string{"A"}, lacks: []string{"B"}},
		{name: "declared beside entries", snap: SnapshotOf([]*Entry{a}).Declare("B"), has: []string{"A", "B"}, lacks: []string{"C"}, len: 1},
		{name: "emptied by an update", snap: SnapshotOf([]*Entry{a, b}).Update(nil, map[string][]string{"A": {"a"}}),
			has: []string{"B"}, lacks: []string{"A"}, len: 1},
		{name: "emptied by an update of a declared one", snap: SnapshotOf([]*Entry{a, b}).Declare().Update(nil, map[string][]string{"A": {"a"}}),
			has: []string{"A", "B"}, lacks: []string{"C"}, len: 1},
		{name: "declared, given entries, emptied", snap: SnapshotOf(nil).Declare("A").Update([]*Entry{b}, nil).Update(nil, map[string][]string{"B": {"b"}}),
			has: []string{"A", "B"}, lacks: []string{"C"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			for _, k := range tc.has {
				g.Expect(tc.snap.Has(k)).To(BeTrue(), k)
			}
			for _, k := range tc.lacks {
				g.Expect(tc.snap.Has(k)).To(BeFalse(), k)
			}
			if tc.has == nil {
				g.Expect(tc.snap.Types()).To(BeEmpty())
			} else {
				g.Expect(tc.snap.Types()).To(Equal(tc.has))
			}
			g.Expect(tc.snap.Len()).To(Equal(tc.len), "a declared type adds no resource")
		})
	}
}

// A declared type without resources is served as an empty type: a SotW client of it gets its
// state, an empty response (nothing to send a delta client, which holds nothing). A type a
// declared snapshot lacks is not answered at all, not even with an empty state, until the
// snapshot has it: declared empty, as the guard declares a type its wrapped cache answered with
// nothing, or with resources.
func TestADeclaredTypeWithoutResourcesIsServedEmpty(t *testing.T) {
	const kind = resourcev3.ClusterType
	for _, tc := range []struct {
		name     string
		sotw     bool
		declared bool // the first snapshot declares the type
		onServed bool // the type is declared on the served snapshot itself (Declare, no Update)
		// what the client is sent: first, once the type is declared empty (nil: nothing; empty:
		// an empty response)
		first, declaredEmpty []string
	}{
		{name: "sotw, declared", sotw: true, declared: true, first: []string{}},
		{name: "sotw, lacked", sotw: true, declaredEmpty: []string{}},
		{name: "sotw, lacked, declared on the served snapshot", sotw: true, onServed: true, declaredEmpty: []string{}},
		{name: "delta, declared", declared: true},
		{name: "delta, lacked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewWithT(t)
				c := NewCache([]string{resourcev3.ListenerType, kind})
				defer c.Close()
				tr := NewTracker(c)
				snap := SnapshotOf(nil).Declare() // no type answered yet
				if tc.declared {
					snap = snap.Declare(kind)
				}
				c.SetSnapshot(snap)
				cl := openClient(t, c, tr, 1, "node-1", tc.sotw)
				g.Expect(cl.ask(kind, nil, "")).To(Succeed())
				expectSent(t, cl.ackAll(kind, nil), tc.first, "first")

				// The type answered with nothing, as the guard's feed writes it.
				snap = c.Snapshot().Update(nil, map[string][]string{kind: nil})
				if tc.onServed {
					snap = c.Snapshot()
				}
				if !snap.Has(kind) {
					snap = snap.Declare(kind)
				}
				c.SetSnapshot(snap)
				expectSent(t, cl.ackAll(kind, nil), tc.declaredEmpty, "declared empty")

				c.SetSnapshot(c.Snapshot().Update([]*Entry{clusterEntry(t, "a", "1")}, nil))
				expectSent(t, cl.ackAll(kind, nil), []string{"a"}, "a resource of it")
			})
		})
	}
}
