package owner

// The entries of the snapshot served, by the owners they name: what a zone may no longer be
// shown once it removed one of those owners.
//
// Invariants, under Holds.mu:
//   - When Holds.dependents is not nil, it indexes exactly the entries of Holds.snap under every
//     owner each names (owners: its Mesh, its explicit owners), by resource.Key.String(); sets
//     are never empty.
//   - It is made on first need (a zone removed something), then kept as the snapshot changes:
//     Changed updates it with the changed entries alone, or drops it when the new snapshot was
//     not derived from the previous one.

import (
	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
)

// dependents maps an owner (resource.Key.String()) to the keys of the entries that name it.
type dependents map[string]map[resource.Key]bool

// dependentsOf indexes every entry of snap.
func dependentsOf(snap *engine.Snapshot) dependents {
	d := dependents{}
	for _, kind := range snap.Types() {
		for _, e := range snap.Type(kind) {
			d.add(e)
		}
	}
	return d
}

func (d dependents) add(e *engine.Entry) {
	for _, o := range owners(e) {
		s := o.String()
		if d[s] == nil {
			d[s] = map[resource.Key]bool{}
		}
		d[s][kds.KeyOf(e)] = true
	}
}

func (d dependents) remove(e *engine.Entry) {
	for _, o := range owners(e) {
		s := o.String()
		delete(d[s], kds.KeyOf(e))
		if len(d[s]) == 0 {
			delete(d, s)
		}
	}
}

// update turns the index of prev into the index of snap, which differs from prev in changed
// (kind -> xDS names).
func (d dependents) update(prev, snap *engine.Snapshot, changed map[string][]string) {
	for kind, names := range changed {
		for _, n := range names {
			if e := prev.Type(kind)[n]; e != nil {
				d.remove(e)
			}
			if e := snap.Type(kind)[n]; e != nil {
				d.add(e)
			}
		}
	}
}
