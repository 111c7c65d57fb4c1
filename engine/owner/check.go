package owner

// One check of one node: which entries it looks at, the Predict call, and how its decision lands
// in the node's verdicts.
//
// Invariants:
//   - A check reads the node's pending work and the snapshot under Holds.mu, calls the policy
//     without any lock, and records its verdicts under Holds.mu only if the node is still the
//     same open node; its verdicts cover exactly the entries it looked at (all of the snapshot
//     for a full check).
//   - What the node's inventory or the snapshot brings while its check is in flight is weighed
//     again against the check's verdicts once they are recorded, so no ACK, removal or write is
//     lost to a check that read the inventory or the snapshot before it.
//   - An entry becomes visible to a node only through a check's verdict (or a failed check, which
//     accepts everything it looked at), and every entry it made visible is refreshed.

import (
	"context"
	"slices"
	"time"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/internal/within"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// inFlight is what a node's check in flight has to weigh once its verdicts are in.
type inFlight struct {
	checking bool      // a worker is checking the node
	arrivals []arrival // what arrived meanwhile (holds.go), unless a full check is pending
	// moved: the node's inventory changed meanwhile (an ACK, a NACK's stored part, a new stream),
	// so the check may have read a state its digest does not name (shared.go).
	moved bool
}

// check asks the policy once about the node's pending work (every entry it does not hold at its
// current version, or the changed ones and their owners), records the verdicts, and refreshes the
// node's view where an entry became visible.
func (h *Holds) check(ctx context.Context, node string) {
	h.mu.Lock()
	z := h.nodes[node]
	if z == nil || !z.open {
		h.mu.Unlock()
		return // the node left
	}
	snap, full, keys := h.snap, z.full, z.keys
	z.full, z.keys, z.shared = false, nil, false
	z.checking, z.arrivals, z.moved = true, nil, false
	h.mu.Unlock()
	if own, ok := h.nodeSnapshot(node); ok {
		snap, full = own, true
	} else if snap == nil {
		snap = h.cfg.Source.Snapshot()
	}
	if !full && 2*len(keys) >= snap.Len() {
		full = true // most of the snapshot (a Mesh ACK releasing what waited): one walk, one table
	}

	o := h.decision(ctx, node, z, snap, full, keys)
	var shown map[string][]string
	if o != nil {
		// Only this worker changes z's verdicts (the node is scheduled), so it reads them unlocked.
		shown = o.shownTo(z)
	}
	h.mu.Lock()
	arrivals := z.arrivals
	z.checking, z.arrivals, z.moved = false, nil, false
	if o == nil || h.nodes[node] != z || !z.open {
		h.mu.Unlock()
		return // stopped, or the node left meanwhile
	}
	switch {
	case full:
		// The decision covers every entry of snap: the node's verdicts are snap and what it held.
		z.base, z.table, z.own, z.ownWaiting, z.ownOwners, z.ownHeld = snap, o.table, ownLayers{}, nil, nil, 0
	case rebases(z, snap, o):
		// Every entry that differs between the node's base and snap was looked at and accepted:
		// snap is the base now, and the node keeps sharing its verdicts with the nodes that
		// decided the same (a write accepted everywhere costs no map per node).
		z.base = snap
	default:
		if z.ownWaiting == nil {
			z.ownWaiting, z.ownOwners = map[engine.Ref]map[engine.Ref]bool{}, map[engine.Ref][]engine.Ref{}
		}
		for _, k := range o.gone {
			z.setOwn(k, Verdict{}, nil) // no version: never visible until checked again
		}
		for _, e := range o.d.Accepted {
			z.setOwn(refOfEntry(e), Verdict{Version: e.Version}, nil)
		}
		for k, v := range o.d.Withheld {
			var owners []engine.Ref
			if e := snap.Type(k.TypeURL)[k.Name]; e != nil {
				owners = h.cfg.owners(e)
			}
			z.setOwn(k, v, owners)
		}
	}
	// What arrived while the policy was asked was weighed against the verdicts before: weigh it
	// against these (its worker queues the node again for the work it makes).
	for _, a := range arrivals {
		h.reconsider(z, a)
	}
	h.views++
	pub := z.publishLocked(h.views)
	h.mu.Unlock()
	// Outside Holds.mu: the session's view is the cache's, and the cache never waits for Holds.
	h.cfg.Refresher.Publish(node, pub)
	if len(shown) > 0 {
		h.cfg.Refresher.Refresh(node, shown)
	}
}

// rebases reports whether a check that is not full leaves z with no verdict of its own: z has
// none, the check held nothing back and looked at no key z's table holds, and snap is z's base or
// derived from it by changes the check accepted (or removed entries, which are not visible once
// snap is the base).
func rebases(z *nodeHolds, snap *engine.Snapshot, o *outcome) bool {
	if z.own.len() > 0 || len(o.d.Withheld) > 0 || z.base == nil {
		return false
	}
	if z.table != nil {
		for _, e := range o.d.Accepted {
			if _, held := z.table.held[refOfEntry(e)]; held {
				return false
			}
		}
		for _, k := range o.gone {
			if _, held := z.table.held[k]; held {
				return false
			}
		}
	}
	if z.base == snap {
		return true
	}
	changed, ok := snap.ChangesFrom(z.base)
	if !ok {
		return false
	}
	// The accepted entries are snap's: a changed entry was accepted if it is one of them. A check
	// of a write looks at a few, so a scan; a map past that.
	accepted := func(e *engine.Entry) bool { return slices.Contains(o.d.Accepted, e) }
	if len(o.d.Accepted) > 16 {
		set := make(map[*engine.Entry]bool, len(o.d.Accepted))
		for _, e := range o.d.Accepted {
			set[e] = true
		}
		accepted = func(e *engine.Entry) bool { return set[e] }
	}
	for typeURL, names := range changed {
		entries := snap.Type(typeURL)
		for _, n := range names {
			if e := entries[n]; e != nil && !accepted(e) {
				return false
			}
		}
	}
	return true
}

// decide runs one check of node against snap: plan, Predict, decision (and the hooks). It
// returns nil when ctx is done.
func (h *Holds) decide(ctx context.Context, node string, snap *engine.Snapshot, full bool, keys map[engine.Ref]bool, ownerTypes []string) *outcome {
	entries, gone := h.entriesFor(node, snap, full, keys)
	plan := newPlan(&h.cfg.Mapping, node, entries, nil, func(typeURL, name string) (string, bool) {
		return h.cfg.Inventory.AckedVersion(node, typeURL, name)
	})
	o := &outcome{gone: gone}
	if plan.Asks() {
		var extra []engine.Ref
		if ownerTypes != nil {
			// The owners the candidates name on the wire: the inventory lists those the node
			// holds whatever their type (the plugin protocol's owner_kinds).
			for _, c := range plan.Request.Candidates {
				extra = append(extra, h.cfg.refsOf(c.GetOwners())...)
			}
		}
		for _, r := range h.cfg.Inventory.InventoryKeys(node, ownerTypes, extra) {
			plan.Request.Inventory = append(plan.Request.Inventory, h.cfg.wireKey(r))
		}
		start := time.Now()
		resp, err := within.Do(ctx, &h.abandoned, h.cfg.Timeout, func(ctx context.Context) (*pluginv1.PredictResponse, error) {
			return h.cfg.Policy().Predict(ctx, plan.Request)
		})
		if ctx.Err() != nil {
			return nil
		}
		o.d = plan.decide(resp, err)
		if h.cfg.Hooks.Call != nil {
			h.cfg.Hooks.Call(node, len(plan.Request.Candidates), time.Since(start), o.d.Err)
		}
		if o.d.Err != nil && h.cfg.Hooks.FailOpen != nil {
			h.cfg.Hooks.FailOpen(node, o.d.Err)
		}
	} else {
		o.d = plan.decide(nil, nil)
	}
	if full {
		o.table = newTable(o.d.Withheld, snap, &h.cfg.Mapping)
	}
	return o
}

// entriesFor returns the snapshot entries a check looks at: every entry, or the keys asked for
// and, transitively, the owners they name that are served (a candidate's owner is a candidate
// too, so the policy can tell "wait for it" from "it exists nowhere"); and the keys no longer
// served.
func (h *Holds) entriesFor(node string, snap *engine.Snapshot, full bool, keys map[engine.Ref]bool) (entries []*engine.Entry, gone []engine.Ref) {
	if full {
		for _, typeURL := range snap.Types() {
			for _, e := range snap.Type(typeURL) {
				entries = append(entries, e)
			}
		}
		return entries, nil
	}
	seen := make(map[engine.Ref]bool, len(keys))
	queue := make([]engine.Ref, 0, len(keys))
	for k := range keys {
		queue = append(queue, k)
	}
	for len(queue) > 0 {
		k := queue[0]
		queue = queue[1:]
		if seen[k] {
			continue
		}
		seen[k] = true
		e, ok := snap.Type(k.TypeURL)[k.Name]
		if !ok {
			gone = append(gone, k)
			continue
		}
		entries = append(entries, e)
		for _, o := range h.cfg.owners(e) {
			served, ok := snap.Type(o.TypeURL)[o.Name]
			if !ok {
				continue // served nowhere: the policy's to judge (REJECT), not a candidate
			}
			if v, held := h.cfg.Inventory.AckedVersion(node, o.TypeURL, o.Name); !held || v != served.Version {
				queue = append(queue, o)
			}
		}
	}
	return entries, gone
}
