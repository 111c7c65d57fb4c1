package owner

// The entries of the snapshot served, by the owners they name: what a node may no longer be
// shown once it removed one of those owners.
//
// Invariants, under Holds.mu:
//   - When Holds.dependents is not nil, it indexes exactly the entries of Holds.snap under every
//     owner each names (Mapping.Owners); sets are never empty.
//   - It is made on first need (a node removed something), then kept as the snapshot changes:
//     Changed updates it with the changed entries alone, or drops it when the new snapshot was
//     not derived from the previous one.

import (
	"github.com/kds-host/kds-host/engine"
)

// dependents maps an owner to the keys of the entries that name it.
type dependents map[engine.Ref]map[engine.Ref]bool

// dependentsOf indexes every entry of snap under the owners m says it names.
func dependentsOf(snap *engine.Snapshot, m *Mapping) dependents {
	d := dependents{}
	for _, typeURL := range snap.Types() {
		for _, e := range snap.Type(typeURL) {
			d.add(e, m)
		}
	}
	return d
}

func (d dependents) add(e *engine.Entry, m *Mapping) {
	for _, o := range m.owners(e) {
		if d[o] == nil {
			d[o] = map[engine.Ref]bool{}
		}
		d[o][refOfEntry(e)] = true
	}
}

func (d dependents) remove(e *engine.Entry, m *Mapping) {
	for _, o := range m.owners(e) {
		delete(d[o], refOfEntry(e))
		if len(d[o]) == 0 {
			delete(d, o)
		}
	}
}

// update turns the index of prev into the index of snap, which differs from prev in changed
// (type URL -> names).
func (d dependents) update(prev, snap *engine.Snapshot, changed map[string][]string, m *Mapping) {
	for typeURL, names := range changed {
		for _, n := range names {
			if e := prev.Type(typeURL)[n]; e != nil {
				d.remove(e, m)
			}
			if e := snap.Type(typeURL)[n]; e != nil {
				d.add(e, m)
			}
		}
	}
}
