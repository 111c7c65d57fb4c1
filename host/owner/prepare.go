package owner

// A write decided once for the zones at rest, before the cache sends it.
//
// Invariants:
//   - Prepare runs before the cache serves snap (guard.Cache.SetSnapshot), one at a time
//     (prepareMu); it changes a zone only under Holds.mu, and only a zone at rest (atRest) from
//     the moment it grouped it to the moment it records the decision.
//   - A group is zones that would ask the same (one view: the same table and base, no own
//     verdict; the same inventory digest), decided by one check of its first zone, and moved to
//     snap only when that check accepted every change and nothing held back waits for a changed
//     key (the rebase a worker's check would make: rebases). Any other zone, or group, is left to
//     Changed and the workers, as before.
//   - A zone is moved only if Holds heard no change of its inventory (zoneHolds.heard) since it
//     was grouped, nor of the first zone's while the check read it: a zone's inventory changes
//     on its stream's goroutine, and Holds hears each change before the next is made.
//   - A zone moved here keeps its verdicts' meaning: its base becomes snap, which differs from
//     the old base only by entries the check accepted (or removed); its view is published before
//     the cache evaluates its session for snap, so that one evaluation sends the write.

import (
	"context"
	"slices"

	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
)

// maxPrepared is the most changed entries a write has for Prepare to decide it ahead: a write
// of a few resources, not a bulk change (which the workers check zone by zone, as before).
const maxPrepared = 16

// maxGroups is the most groups of zones Prepare decides a write for: each is one Predict call
// the snapshot waits for (zones that hold the same are most often one group).
const maxGroups = 4

// atRest reports whether z is at rest at prev: open, neither checked nor queued, no work
// pending, no verdict of its own, and its verdicts as of prev (base) published. Call with
// Holds.mu.
func (h *Holds) atRest(name string, z *zoneHolds, prev *kds.Snapshot) bool {
	return z.open && !z.checking && !h.scheduled[name] && !z.full && len(z.keys) == 0 &&
		z.own.len() == 0 && z.base == prev && z.pub != nil && z.pub.base == prev && len(z.pub.own) == 0
}

// prepareGroup is the zones at rest that ask the same of a write.
type prepareGroup struct {
	table  *table
	digest kds.Digest
	zones  []string
	heard  []uint64 // each zone's zoneHolds.heard when it was grouped
}

// Prepare decides snap, derived from the snapshot Holds checks against now by a write of a few
// entries, for the zones at rest, before the cache serves it: zones that would ask the same are
// decided by one check, and when it accepts the write they see it at once, with no check of
// their own (Changed gives them none). It needs the policy's answers to be zone independent;
// otherwise, for another kind of snapshot, or for zones not at rest, it does nothing and
// Changed queues the checks as before. It returns when the groups are decided: the largest
// maxGroups, each one Predict call within the policy's deadline, stopping at the first that
// fails (the zones left are the workers', as before).
func (h *Holds) Prepare(snap *kds.Snapshot) {
	h.prepareMu.Lock()
	defer h.prepareMu.Unlock()
	ctx := h.ctx
	decl := h.described.get(ctx)
	if !decl.shared || ctx.Err() != nil {
		return
	}
	h.mu.RLock()
	prev := h.snap
	changed, delta := snap.ChangesFrom(prev)
	n := 0
	for _, names := range changed {
		n += len(names)
	}
	if !delta || n == 0 || n > maxPrepared {
		h.mu.RUnlock()
		return
	}
	keys, owners := changedKeys(changed)
	// The zones at rest, with what they had heard: a zone that hears anything more before its
	// group is decided is left out (its inventory may differ from the one it was grouped by).
	type atRestZone struct {
		name  string
		table *table
		heard uint64
	}
	var rest []atRestZone
	for name, z := range h.zones {
		if h.atRest(name, z, prev) && !waitsFor(z.table, owners) {
			rest = append(rest, atRestZone{name, z.table, z.heard})
		}
	}
	h.mu.RUnlock()

	// Grouped by view and inventory, outside the lock: the digest is the zone's stream's.
	type groupKey struct {
		table  *table
		digest kds.Digest
	}
	groups := map[groupKey]*prepareGroup{}
	var order []*prepareGroup
	for _, r := range rest {
		k := groupKey{r.table, h.cfg.Inventory.InventoryDigest(r.name)}
		g := groups[k]
		if g == nil {
			g = &prepareGroup{table: k.table, digest: k.digest}
			groups[k] = g
			order = append(order, g)
		}
		g.zones = append(g.zones, r.name)
		g.heard = append(g.heard, r.heard)
	}
	// The largest groups first, and a few of them: the snapshot waits for their checks, one
	// Predict call each, and the zones left over are checked by the workers as before.
	slices.SortStableFunc(order, func(a, b *prepareGroup) int { return len(b.zones) - len(a.zones) })
	for _, g := range order[:min(len(order), maxGroups)] {
		if !h.prepareGroup(ctx, g, prev, snap, keys, decl.kinds) {
			return // the policy failed: no more waiting on it here
		}
	}
}

// waitsFor reports whether a table holds back anything that waits for one of owners (a changed
// entry): its zones need that looked at again, which a check of their own does.
func waitsFor(t *table, owners []string) bool {
	if t == nil {
		return false
	}
	for _, o := range owners {
		if len(t.waiting[o]) > 0 {
			return true
		}
	}
	return false
}

// prepareGroup decides the write for one group by a check of its first zone, and moves every
// zone of it that is still at rest, with the same inventory, to snap. It reports false when the
// check failed (stopped, or the policy failed open).
func (h *Holds) prepareGroup(ctx context.Context, g *prepareGroup, prev, snap *kds.Snapshot, keys map[resource.Key]bool, kinds []string) bool {
	first := g.zones[0]
	o := h.decide(ctx, first, snap, false, keys, kinds)
	if o == nil || o.d.Err != nil {
		return false
	}
	if len(o.d.Withheld) > 0 {
		return true // something held back: the zones' own checks decide
	}
	probe := &zoneHolds{table: g.table, base: prev}
	if !rebases(probe, snap, o) {
		return true
	}
	h.mu.Lock()
	if h.snap != prev {
		h.mu.Unlock()
		return true // another snapshot came in meanwhile (a caller not in guard's order)
	}
	if z := h.zones[first]; z == nil || z.heard != g.heard[0] {
		h.mu.Unlock()
		return true // the first zone heard something while checked: the answer is its own
	}
	h.views++
	pub := &Published{table: g.table, base: snap, seq: h.views}
	moved := make([]string, 0, len(g.zones))
	for i, name := range g.zones {
		// A zone's inventory changes on its stream's goroutine and Holds hears each change
		// (heard) before the next is made: one that heard nothing since it was grouped holds
		// what it held then, which its group's answer is for.
		z := h.zones[name]
		if z == nil || z.heard != g.heard[i] || !h.atRest(name, z, prev) || z.table != g.table {
			continue
		}
		z.base, z.pub, z.prepared = snap, pub, snap
		moved = append(moved, name)
	}
	h.mu.Unlock()
	for _, name := range moved {
		h.cfg.Refresher.Publish(name, pub)
	}
	return true
}
