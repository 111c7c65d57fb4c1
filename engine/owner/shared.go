package owner

// Shared answers: nodes whose checks ask the same (one snapshot, one policy generation, the same
// inventory and work) share one Predict answer, when the policy declares it node independent.
//
// Invariants:
//   - Holds.shared holds answers for Holds.snap only (Changed empties it), at most maxShared of
//     them, and is read and written under Holds.mu.
//   - An outcome's d, gone and table are written once, under Holds.mu, before its ready channel is
//     closed, and never after: a node that waited on ready reads them without a lock. An answer
//     that is no good to share (stopped, failed open, or the inventory moved meanwhile) is
//     removed from Holds.shared and marked with an error, so its waiters ask again. The inventory
//     moved if its digest changed or the node heard an ACK or a new stream while checked (its
//     digest may be back where it was after the check read something else).
//   - outcome.mu guards outcome.shown, whose maps are read-only once stored.

import (
	"context"
	"errors"
	"hash/maphash"
	"strings"
	"sync"

	"github.com/kds-host/kds-host/engine"
)

// outcome is one check's decision, which every node that asked the same may use.
type outcome struct {
	ready chan struct{} // closed when d is there (shared outcomes)
	d     Decision
	gone  []engine.Ref // keys asked about that are no longer served
	table *table       // d.Held as a table (full checks)

	mu    sync.Mutex                   // guards shown
	shown map[view]map[string][]string // what d shows to each view it was shared with
}

// view is a node's verdicts when it has no own ones: nodes that share one see the same.
type view struct {
	table *table
	base  *engine.Snapshot
}

// shownTo is what the decision makes visible to z (Decision.Shown), computed once for the nodes
// that shared the decision from the same view. The answer is read-only.
func (o *outcome) shownTo(z *nodeHolds) map[string][]string {
	if o.ready == nil || z.own.len() > 0 {
		return shown(o.d.Accepted, z)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	v := view{z.table, z.base}
	if s, ok := o.shown[v]; ok {
		return s
	}
	s := shown(o.d.Accepted, z)
	if o.shown == nil {
		o.shown = map[view]map[string][]string{}
	}
	o.shown[v] = s
	return s
}

// shareKey is what makes two nodes' checks ask the same.
type shareKey struct {
	snap       *engine.Snapshot
	generation uint64
	inventory  engine.Digest
	full       bool
	keys       uint64 // the keys a partial check looks at
	ownerTypes string
}

// decision decides a check of node (z, being checked): the node's own, or one shared with the
// nodes that asked the same before (or are asking now). It returns nil when ctx is done.
func (h *Holds) decision(ctx context.Context, node string, z *nodeHolds, snap *engine.Snapshot, full bool, keys map[engine.Ref]bool) *outcome {
	decl := h.described.get(ctx)
	ownerTypes := decl.ownerTypes
	if !decl.shared {
		return h.decide(ctx, node, snap, full, keys, ownerTypes)
	}
	key := shareKey{snap: snap, generation: decl.generation, inventory: h.cfg.Inventory.InventoryDigest(node), full: full, ownerTypes: strings.Join(ownerTypes, ",")}
	if !full {
		key.keys = keysHash(keys)
	}
	for {
		h.mu.Lock()
		o, found := h.shared[key]
		if !found && h.snap == snap {
			o = &outcome{ready: make(chan struct{})}
			if h.shared == nil || len(h.shared) >= maxShared {
				h.shared = map[shareKey]*outcome{}
			}
			h.shared[key] = o
		}
		h.mu.Unlock()
		if o == nil {
			// The snapshot moved on: this check is stale, and its node has new work queued.
			return h.decide(ctx, node, snap, full, keys, ownerTypes)
		}
		if found {
			select {
			case <-o.ready:
			case <-ctx.Done():
				return nil
			}
			if o.d.Err == nil {
				return o
			}
			continue // that check failed open: ask again
		}
		mine := h.decide(ctx, node, snap, full, keys, ownerTypes)
		moved := h.cfg.Inventory.InventoryDigest(node) != key.inventory
		h.mu.Lock()
		// The same digest at both ends is not enough: the inventory may have moved and come back
		// in between (a new stream starts from nothing and reports the same again), the check
		// reading it meanwhile. A node's inventory changes on its stream's goroutine, and Holds
		// hears each change (z.moved) before the next is made (engine.Nodes hears a new stream
		// first), so an inventory that came back was heard moving.
		moved = moved || z.moved
		if mine == nil || mine.d.Err != nil || moved {
			// Not an answer to share: stopped, failed open, or the inventory moved while the
			// check read it.
			if h.shared[key] == o {
				delete(h.shared, key)
			}
			o.d.Err = errors.New("not shared")
		} else {
			o.d, o.gone, o.table = mine.d, mine.gone, mine.table
		}
		h.mu.Unlock()
		close(o.ready)
		return mine
	}
}

// maxShared bounds the answers kept for sharing (each a set of nodes that hold the same).
const maxShared = 256

// keysHash identifies a set of keys, whatever their order.
func keysHash(keys map[engine.Ref]bool) uint64 {
	var sum uint64
	for k := range keys {
		var h maphash.Hash
		h.SetSeed(keysSeed)
		h.WriteString(k.TypeURL)
		h.WriteByte(0)
		h.WriteString(k.Name)
		sum ^= h.Sum64()
	}
	return sum ^ uint64(len(keys))
}

var keysSeed = maphash.MakeSeed()
