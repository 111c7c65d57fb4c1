package owner

// The verdict store: what each zone may see, in three layers (own, table, base), and the indexes
// of what waits for which owner.
//
// Invariants:
//   - A zone's verdict of a key is its own verdict if it has one, else its table's, else the
//     base snapshot's version (accepted); a key in none is not visible.
//   - ownWaiting indexes exactly own's WAIT verdicts that name an owner, and a table's waiting
//     indexes exactly its held WAIT verdicts that name an owner; setOwn and newTable keep them so.
//   - A table is read-only once made: zones that held the same after a full check share it.
//   - Every field of a zoneHolds is read and written under Holds.mu, but for one exception: the
//     verdict layers (own, ownWaiting, table, base) are written only by the worker checking the
//     zone (a zone is checked by one worker at a time, see queue.go), which therefore may read
//     them without the lock.

import (
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
)

// zoneHolds is what Holds keeps for one zone: while it is connected, and after its last stream
// closed until Forget (the zone's grace period), so that a zone back soon is not checked from
// scratch.
//
// Its verdicts come in three layers, the first that knows a key wins: own, what the checks of
// some entries (a write, an ACK) decided since the last full check; table, what that full check
// held back; base, the snapshot it checked, whose every other entry is accepted at the version
// it has there. So a zone that may see everything costs nothing per resource, and zones that
// hold the same share one table.
type zoneHolds struct {
	stream int64
	open   bool

	own Verdicts
	// ownWaiting indexes own's WAIT verdicts by the owner they wait for (resource.Key.String()).
	ownWaiting map[string]map[resource.Key]bool
	table      *table
	base       *kds.Snapshot

	pending // what the next check looks at (queue.go)
}

// table is what one full check held back, read-only once made: several zones may point at it.
type table struct {
	held    Verdicts
	waiting map[string][]resource.Key // held's WAIT verdicts, by the owner they wait for
}

func newTable(held Verdicts) *table {
	t := &table{held: held, waiting: map[string][]resource.Key{}}
	for k, v := range held {
		if v.Held.Verdict == Wait && v.Held.WaitingFor != "" {
			t.waiting[v.Held.WaitingFor] = append(t.waiting[v.Held.WaitingFor], k)
		}
	}
	return t
}

// verdict is the zone's verdict of k, if it has one.
func (z *zoneHolds) verdict(k resource.Key, name string) (Verdict, bool) {
	if v, ok := z.own[k]; ok {
		return v, true
	}
	if z.table != nil {
		if v, ok := z.table.held[k]; ok {
			return v, true
		}
	}
	if e := z.base.Kind(k.Kind)[name]; e != nil {
		return Verdict{Version: e.Version}, true
	}
	return Verdict{}, false
}

// VisibleVersion implements View.
func (z *zoneHolds) VisibleVersion(k resource.Key) string {
	v, _ := z.verdict(k, k.XDSName())
	return v.visible()
}

// visibleEntry is VisibleVersion of an entry's key, without building its xDS name.
func (z *zoneHolds) visibleEntry(e *kds.Entry) string {
	v, _ := z.verdict(e.Key, e.Name)
	return v.visible()
}

// addWaiting adds what waits for owner to the next check's work, and reports whether anything
// does. When that is most of the snapshot (snapLen entries; a Mesh ACK releasing what waited
// for it) the next check looks at everything instead: one walk, not a set of every key.
func (z *zoneHolds) addWaiting(owner string, snapLen int) bool {
	var shared []resource.Key
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

func (z *zoneHolds) waits() bool {
	return len(z.ownWaiting) > 0 || (z.table != nil && len(z.table.waiting) > 0)
}

// setOwn records the verdict of k in own (a verdict without version: k is no longer served) and
// keeps own's waiting index.
func (z *zoneHolds) setOwn(k resource.Key, v Verdict) {
	if old, had := z.own[k]; had && old.Held != nil && old.Held.WaitingFor != "" {
		if w := z.ownWaiting[old.Held.WaitingFor]; w != nil {
			delete(w, k)
			if len(w) == 0 {
				delete(z.ownWaiting, old.Held.WaitingFor)
			}
		}
	}
	z.own[k] = v
	if v.Held != nil && v.Held.Verdict == Wait && v.Held.WaitingFor != "" {
		w := z.ownWaiting[v.Held.WaitingFor]
		if w == nil {
			w = map[resource.Key]bool{}
			z.ownWaiting[v.Held.WaitingFor] = w
		}
		w[k] = true
	}
}
