package owner

// The verdict store: what each node may see, in three layers (own, table, base), and the indexes
// of what waits for which owner.
//
// Invariants:
//   - A node's verdict of a key is its own verdict if it has one, else its table's, else the
//     base snapshot's version (accepted); a key in none is not visible.
//   - ownWaiting indexes exactly own's held verdicts, and a table's waiting exactly its held
//     verdicts, each under the owners it depends on (heldUnder: what it waits for, and every
//     owner its entry names), so that a change or an arrival of any of them re-checks it;
//     ownOwners is what each of own's held verdicts is indexed under, and ownHeld how many
//     there are. setOwn and newTable keep them so.
//   - A table is read-only once made: nodes that held the same after a full check share it.
//   - Every field of a nodeHolds is read and written under Holds.mu, but for one exception: the
//     verdict layers (own, ownWaiting, ownOwners, table, base) are written only by the worker
//     checking the node (a node is checked by one worker at a time, see queue.go), which
//     therefore may read them without the lock.

import (
	"slices"

	"github.com/kds-host/kds-host/engine"
)

// nodeHolds is what Holds keeps for one node: while it is connected, and after its last stream
// closed until Forget (the node's grace period), so that a node back soon is not checked from
// scratch.
//
// Its verdicts come in three layers, the first that knows a key wins: own, what the checks of
// some entries (a write, an ACK) decided since the last full check; table, what that full check
// held back; base, the snapshot it checked, whose every other entry is accepted at the version
// it has there. So a node that may see everything costs nothing per resource, and nodes that
// hold the same share one table.
type nodeHolds struct {
	stream int64
	open   bool

	own ownLayers  // published.go
	pub *Published // the view of its verdicts its session reads, as of its last check
	// ownWaiting indexes own's held verdicts by the owners they depend on (heldUnder).
	ownWaiting map[engine.Ref]map[engine.Ref]bool
	ownOwners  map[engine.Ref][]engine.Ref // the owners each of own's held verdicts is indexed under
	ownHeld    int                         // how many of own's verdicts are held
	table      *table
	base       *engine.Snapshot

	pending  // what the next check looks at (queue.go)
	inFlight // while it is checked (check.go)
	// prepared is the snapshot Prepare moved the node to ahead of Changed (prepare.go), until
	// Changed has seen it.
	prepared *engine.Snapshot
	// heard counts the changes of the node's inventory Holds has heard (an ACK, a NACK's stored
	// part, a new stream): Prepare tells by it that a node holds what it held when grouped.
	heard uint64
}

// holdsBack reports whether any of z's verdicts is held: when none is, an arrival (the node now
// holds a resource) can change none of them.
func (z *nodeHolds) holdsBack() bool {
	return z.ownHeld > 0 || (z.table != nil && len(z.table.held) > 0)
}

// table is what one full check held back, read-only once made: several nodes may point at it.
type table struct {
	held    Verdicts
	waiting map[engine.Ref][]engine.Ref // held's verdicts, by the owners they are held under (heldUnder)
}

// newTable indexes held, the verdicts a check of snap held back, under the owners m says their
// entries name.
func newTable(held Verdicts, snap *engine.Snapshot, m *Mapping) *table {
	t := &table{held: held, waiting: map[engine.Ref][]engine.Ref{}}
	for k, v := range held {
		var owners []engine.Ref
		if e := snap.Type(k.TypeURL)[k.Name]; e != nil {
			owners = m.owners(e)
		}
		for _, o := range heldUnder(v, owners) {
			t.waiting[o] = append(t.waiting[o], k)
		}
	}
	return t
}

// heldUnder are the owners whose change in the snapshot or arrival on the node may change a held
// verdict of an entry that names owners: what it waits for, and every one of owners (a REJECT
// for an owner served nowhere may become a WAIT or an ACCEPT once that owner is written or
// arrives). An accepted verdict is under none.
func heldUnder(v Verdict, owners []engine.Ref) []engine.Ref {
	if v.Withheld == nil {
		return nil
	}
	var out []engine.Ref
	if v.Withheld.WaitingFor != (engine.Ref{}) {
		out = append(out, v.Withheld.WaitingFor)
	}
	for _, o := range owners {
		if !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	return out
}

// verdict is the node's verdict of k, if it has one.
func (z *nodeHolds) verdict(k engine.Ref) (Verdict, bool) {
	if v, ok := z.own.get(k); ok {
		return v, true
	}
	return below(z.table, z.base, k)
}

// below is the verdict of k under a node's own verdicts: its table's, else the base snapshot's
// version (accepted).
func below(t *table, base *engine.Snapshot, k engine.Ref) (Verdict, bool) {
	if t != nil {
		if v, ok := t.held[k]; ok {
			return v, true
		}
	}
	if e := base.Type(k.TypeURL)[k.Name]; e != nil {
		return Verdict{Version: e.Version}, true
	}
	return Verdict{}, false
}

// VisibleVersion implements View.
func (z *nodeHolds) VisibleVersion(k engine.Ref) string {
	v, _ := z.verdict(k)
	return v.visible()
}

// addWaiting adds what waits for owner to the next check's work, and reports whether anything
// does. When that is most of the snapshot (snapLen entries; a Mesh ACK releasing what waited
// for it) the next check looks at everything instead: one walk, not a set of every key.
func (z *nodeHolds) addWaiting(owner engine.Ref, snapLen int) bool {
	var shared []engine.Ref
	if z.table != nil {
		shared = z.table.waiting[owner]
	}
	n := len(z.ownWaiting[owner]) + len(shared)
	if n == 0 || z.full {
		return n > 0
	}
	if 2*(len(z.keys)+n) >= snapLen {
		z.full, z.keys = true, nil
		return true
	}
	for k := range z.ownWaiting[owner] {
		z.addWork(k)
	}
	for _, k := range shared {
		z.addWork(k) // a key own decided since is looked at again: harmless
	}
	return true
}

// setOwn records the verdict of k in own (a verdict without version: k is no longer served),
// owners being what the entry it judged names (Mapping.Owners; nil for none, or no entry), and
// keeps own's waiting index.
func (z *nodeHolds) setOwn(k engine.Ref, v Verdict, owners []engine.Ref) {
	for _, o := range z.ownOwners[k] {
		if w := z.ownWaiting[o]; w != nil {
			delete(w, k)
			if len(w) == 0 {
				delete(z.ownWaiting, o)
			}
		}
	}
	delete(z.ownOwners, k)
	if old, had := z.own.get(k); had && old.Withheld != nil {
		z.ownHeld--
	}
	if v.Withheld != nil {
		z.ownHeld++
	}
	z.own.set(k, v)
	under := heldUnder(v, owners)
	if len(under) == 0 {
		return
	}
	z.ownOwners[k] = under
	for _, o := range under {
		w := z.ownWaiting[o]
		if w == nil {
			w = map[engine.Ref]bool{}
			z.ownWaiting[o] = w
		}
		w[k] = true
	}
}
