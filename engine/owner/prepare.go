package owner

// A write decided once for the nodes at rest, before the cache sends it.
//
// Invariants:
//   - Prepare runs before the cache serves snap (guard.Cache.SetSnapshot), one at a time
//     (prepareMu); it changes a node only under Holds.mu, and only a node that was at rest
//     (atRest) when it was grouped and still is when the decision is recorded.
//   - A group is nodes that would ask the same (one view: the same table and base, no own
//     verdict; the same inventory digest), decided by one check of its first node, and moved to
//     snap only when that check accepted every change and nothing held back waits for a changed
//     key (the rebase a worker's check would make: rebases). Any other node, or group, is left to
//     Changed and the workers, as before.
//   - A node is moved only if Holds heard no change of its inventory (nodeHolds.heard) since it
//     was grouped, nor of the first node's while the check read it: a node's inventory changes
//     on its stream's goroutine, and Holds hears each change before the next is made.
//   - A node moved here keeps its verdicts' meaning: its base becomes snap, which differs from
//     the old base only by entries the check accepted (or removed); its view is published before
//     the cache evaluates its session for snap, so that one evaluation sends the write.

import (
	"context"
	"slices"

	"github.com/kds-host/kds-host/engine"
)

// maxPrepared is the most changed entries a write has for Prepare to decide it ahead: a write
// of a few resources, not a bulk change (which the workers check node by node, as before).
const maxPrepared = 16

// maxGroups is the most groups of nodes Prepare decides a write for: each is one Predict call
// the snapshot waits for (nodes that hold the same are most often one group).
const maxGroups = 4

// atRest reports whether z is at rest at prev: open, neither checked nor queued, no work
// pending, no verdict of its own, and its verdicts as of prev (base) published. Call with
// Holds.mu.
func (h *Holds) atRest(name string, z *nodeHolds, prev *engine.Snapshot) bool {
	return z.open && !z.checking && !h.scheduled[name] && !z.full && len(z.keys) == 0 &&
		z.own.len() == 0 && z.base == prev && z.pub != nil && z.pub.base == prev && len(z.pub.own) == 0
}

// restNode is a node at rest when Prepare looked: its view, what it had heard then (a node that
// hears anything more before its group is decided is left out: its inventory may differ from
// the one it was grouped by), its inventory, its group, and whether it was moved.
type restNode struct {
	name   string
	table  *table
	heard  uint64
	digest engine.Digest
	group  int
	moved  bool
}

// prepareGroup is the nodes at rest that ask the same of a write: a run of Prepare's buffer.
type prepareGroup []restNode

// Prepare decides snap, derived from the snapshot Holds checks against now by a write of a few
// entries, for the nodes at rest, before the cache serves it: nodes that would ask the same are
// decided by one check, and when it accepts the write they see it at once, with no check of
// their own (Changed gives them none). It needs the policy's answers to be node independent;
// otherwise, for a snapshot not derived that way, or for nodes not at rest, it does nothing and
// Changed queues the checks as before. It returns when the groups are decided: the largest
// maxGroups, each one Predict call within the policy's deadline, stopping at the first that
// fails (the nodes left are the workers', as before).
func (h *Holds) Prepare(snap *engine.Snapshot) {
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
	rest := h.restBuf[:0] // reused: a write at 10,000 nodes makes no list of them
	for name, z := range h.nodes {
		if h.atRest(name, z, prev) && !waitsFor(z.table, owners) {
			rest = append(rest, restNode{name: name, table: z.table, heard: z.heard})
		}
	}
	h.mu.RUnlock()
	defer func() { clear(rest); h.restBuf = rest[:0] }() // kept for the next, holding nothing

	// Grouped by view and inventory, outside the lock (the digest is the node's stream's), each
	// group a run of rest: the largest first, and a few of them (the snapshot waits for their
	// checks, one Predict call each; the nodes left over are checked by the workers as before).
	type groupKey struct {
		table  *table
		digest engine.Digest
	}
	ids := map[groupKey]int{}
	var sizes []int
	for i := range rest {
		r := &rest[i]
		r.digest = h.cfg.Inventory.InventoryDigest(r.name)
		id, ok := ids[groupKey{r.table, r.digest}]
		if !ok {
			id = len(sizes)
			ids[groupKey{r.table, r.digest}] = id
			sizes = append(sizes, 0)
		}
		r.group = id
		sizes[id]++
	}
	slices.SortStableFunc(rest, func(a, b restNode) int {
		if sizes[a.group] != sizes[b.group] {
			return sizes[b.group] - sizes[a.group]
		}
		return a.group - b.group
	})
	for start, groups := 0, 0; start < len(rest) && groups < maxGroups; groups++ {
		end := start + sizes[rest[start].group]
		if !h.prepareGroup(ctx, prepareGroup(rest[start:end]), prev, snap, keys, decl.ownerTypes) {
			return // the policy failed: no more waiting on it here
		}
		start = end
	}
}

// waitsFor reports whether a table holds back anything that waits for one of owners (a changed
// entry): its nodes need that looked at again, which a check of their own does.
func waitsFor(t *table, owners []engine.Ref) bool {
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

// prepareGroup decides the write for one group by a check of its first node, and moves every
// node of it that is still at rest, with the same inventory, to snap. It reports false when the
// check failed (stopped, or the policy failed open).
func (h *Holds) prepareGroup(ctx context.Context, g prepareGroup, prev, snap *engine.Snapshot, keys map[engine.Ref]bool, ownerTypes []string) bool {
	first := g[0]
	o := h.decide(ctx, first.name, snap, false, keys, ownerTypes)
	if o == nil || o.d.Err != nil {
		return false
	}
	if len(o.d.Withheld) > 0 {
		return true // something held back: the nodes' own checks decide
	}
	probe := &nodeHolds{table: first.table, base: prev}
	if !rebases(probe, snap, o) {
		return true
	}
	h.mu.Lock()
	if h.snap != prev {
		h.mu.Unlock()
		return true // another snapshot came in meanwhile (a caller not in guard's order)
	}
	if z := h.nodes[first.name]; z == nil || z.heard != first.heard {
		h.mu.Unlock()
		return true // the first node heard something while checked: the answer is its own
	}
	h.views++
	pub := &Published{table: first.table, base: snap, seq: h.views}
	for i := range g {
		// A node's inventory changes on its stream's goroutine and Holds hears each change
		// (heard) before the next is made: one that heard nothing since it was grouped holds
		// what it held then, which its group's answer is for.
		r := &g[i]
		z := h.nodes[r.name]
		if z == nil || z.heard != r.heard || !h.atRest(r.name, z, prev) || z.table != r.table {
			continue
		}
		z.base, z.pub, z.prepared = snap, pub, snap
		r.moved = true
	}
	h.mu.Unlock()
	for _, r := range g {
		if r.moved {
			h.cfg.Refresher.Publish(r.name, pub)
		}
	}
	return true
}
