// Package owner holds resources back from a node until their owners are there: before a push,
// Holds asks an OwnerCheck policy (one batched call per check of a node) which resources the node
// would reject for a missing owner, and keeps those out of the node's view until it ACKs the
// owner. With the policy down, it fails open: everything is sent and retries cover the rest.
//
// Plan is the decision, pure: a node's inventory, the candidates and the previous verdicts in,
// the new verdicts and what became visible out. Holds drives it for every connected node (and
// kds-host's `kds-host check` asks it about a file). Holds costs what changed: a write checks the
// changed entries (and what is held back for them), an ACK the entries held back for what it
// brought (and, for what it removed, what names that as owner), found by index; nodes are checked
// in parallel, and nodes that hold the same share one answer when the policy declares its answers
// node independent. What arrives while a node is checked is weighed again once the check is in.
//
// By concern: decision.go is the pure decision (Plan, Decision); verdicts.go the verdicts Holds
// keeps per node; queue.go the nodes waiting for a check and the workers; check.go one check;
// shared.go the answers nodes share; prepare.go a write decided once for the nodes at rest
// before the cache serves it; published.go the own verdicts' layers and the view of a node's
// verdicts published into its session (engine.View); describe.go the policy's Describe
// declaration; dependents.go the snapshot's entries by owner; this file Holds itself and the
// stream events it hears. Each file states the invariants of what it owns (docs/architecture.md
// has the whole).
package owner

// Holds, the nodes it keeps, and the events that give them work.
//
// Invariants:
//   - Holds.mu guards nodes, snap, queue, scheduled, shared and dependents, and the fields of
//     every nodeHolds (with the one exception verdicts.go states).
//   - A node is in nodes from its first stream until Forget, which frees only a node with no open
//     stream; only an open node is given work or checked.
//   - A node not checked yet sees nothing: View shows an entry only at the version of an
//     accepted verdict.

import (
	"cmp"
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/internal/shrink"
	"github.com/kds-host/kds-host/internal/within"
	"github.com/kds-host/kds-host/shared"
)

// Source is what Holds reads: the snapshot being served. A Source that also has
// NodeSnapshot (engine.Cache) may serve each node a snapshot of its own: Holds then checks a node
// against its own, in full whenever it changes (NodeChanged) or what the node holds does.
type Source interface {
	Snapshot() *engine.Snapshot
}

// nodeSource is a Source of per-node snapshots (engine.Cache.NodeSnapshot).
type nodeSource interface {
	NodeSnapshot(node string) (snap *engine.Snapshot, only bool)
}

// Inventory is what each node has ACKed.
type Inventory interface {
	// AckedVersion is the version of a resource (type URL, xDS name) the node holds.
	AckedVersion(node, typeURL, name string) (string, bool)
	// InventoryKeys lists what the node holds of typeURLs (nil: of every type), and which of extra.
	InventoryKeys(node string, typeURLs []string, extra []engine.Ref) []engine.Ref
	// InventoryDigest identifies what the node holds now: checks of two nodes with the same
	// digest at the same snapshot ask the same, and may share one answer.
	InventoryDigest(node string) engine.Digest
	// Connected lists the nodes with an open stream.
	Connected() []string
}

// Refresher is where a node's view goes (engine.Cache): Publish puts the view of its verdicts in the
// node's session, for the cache to read with no lock of Holds; Refresh re-evaluates the node's
// watches for the named entries (type URL -> xDS names) that became visible.
type Refresher interface {
	Publish(node string, v engine.View)
	Refresh(node string, names map[string][]string)
}

// Hooks report decisions, for metrics. Any may be nil.
type Hooks struct {
	Call     func(node string, candidates int, latency time.Duration, err error)
	FailOpen func(node string, err error)
}

// Config is what Holds needs.
type Config struct {
	// Mapping puts the entries on the policy's wire (zero: the default of each field).
	Mapping
	// Policy returns the OwnerCheck in force (a plugin, or the built-in one).
	Policy    func() shared.OwnerCheck
	Timeout   time.Duration // deadline of one Predict call (default 1s)
	Source    Source
	Inventory Inventory
	Refresher Refresher
	Hooks     Hooks
	// Workers is how many nodes are checked at once (default: the cores, at least 2).
	Workers int
	// Generation changes whenever another policy comes into force (a reload). Holds shares one
	// Predict answer between the nodes that ask the same only within one generation, one
	// snapshot, and when the policy declares its answers node independent (Describe's
	// zone_independent); nil shares nothing.
	Generation func() uint64
}

// Holds publishes each node's view (engine.View, for a cache that UseViews), kept to what its
// owners allow, and is the observer that re-checks a node when what it holds changes. A resource
// version not checked yet for a node is not visible to it: nothing reaches a node unchecked,
// except when the policy fails, and then everything does.
type Holds struct {
	cfg Config

	mu        sync.RWMutex // guards the fields below; the policy is never called with it held
	nodes     map[string]*nodeHolds
	peak      shrink.Peak // of nodes
	snap      *engine.Snapshot
	queue     nodeQueue       // nodes with work, in order
	scheduled map[string]bool // nodes queued or being checked
	wake      chan struct{}
	abandoned within.Abandoned // the Predict calls given up at their deadline that still run

	views      uint64 // views published so far (Published.Seq)
	described  described
	shared     map[shareKey]*outcome // answers nodes share, for h.snap only
	dependents dependents            // h.snap's entries by owner, once needed (dependents.go)

	prepareMu sync.Mutex // one Prepare at a time (prepare.go), and its restBuf
	restBuf   []restNode

	ctx    context.Context // until Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New starts the workers that check nodes; Close stops them.
func New(cfg Config) (*Holds, error) {
	if cfg.Policy == nil || cfg.Source == nil || cfg.Inventory == nil || cfg.Refresher == nil {
		return nil, errors.New("owner: Policy, Source, Inventory and Refresher are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = max(2, runtime.GOMAXPROCS(0))
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Holds{cfg: cfg, nodes: map[string]*nodeHolds{}, scheduled: map[string]bool{}, wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
	h.described.policy, h.described.generation = cfg.Policy, cfg.Generation
	for range cfg.Workers {
		h.wg.Go(func() { h.work(ctx) })
	}
	return h, nil
}

// Close stops the workers.
func (h *Holds) Close() {
	h.cancel()
	h.wg.Wait()
}

// Visible reports whether the node may see e now, as its verdicts say (the cache reads the view
// published into the node's session instead: engine.Cache.UseViews).
func (h *Holds) Visible(node string, e *engine.Entry) bool {
	visible, _, release := h.View(node)
	defer release()
	return visible(e)
}

// View is Visible for one node, under one read lock until release. A node not checked yet sees
// nothing.
func (h *Holds) View(node string) (visible func(*engine.Entry) bool, none bool, release func()) {
	h.mu.RLock()
	z := h.nodes[node]
	none = z == nil || (z.base == nil && z.table == nil && z.own.len() == 0)
	return func(e *engine.Entry) bool {
		if z == nil {
			return false
		}
		v, ok := z.verdict(refOfEntry(e))
		return ok && v.Accepted() && v.Version == e.Version
	}, none, h.mu.RUnlock
}

// NodeChanged tells Holds that the node's own snapshot changed (a Source's NodeSnapshot): the
// node is checked again, in full.
func (h *Holds) NodeChanged(node string) {
	h.mu.Lock()
	z := h.nodes[node]
	if z == nil || !z.open {
		h.mu.Unlock()
		return
	}
	z.full = true
	h.mu.Unlock()
	h.enqueue(node)
}

// nodeSnapshot is the node's own snapshot (empty until set), and whether it has one of its own
// to be checked against instead of the one served to every node.
func (h *Holds) nodeSnapshot(node string) (*engine.Snapshot, bool) {
	ns, ok := h.cfg.Source.(nodeSource)
	if !ok {
		return nil, false
	}
	snap, only := ns.NodeSnapshot(node)
	if snap == nil && only {
		snap = engine.SnapshotOf(nil)
	}
	return snap, snap != nil
}

// Changed tells Holds the snapshot served now. When it was derived from the previous one, each
// connected node checks the changed entries and what waits for them; otherwise everything.
func (h *Holds) Changed(snap *engine.Snapshot) {
	h.mu.Lock()
	changed, delta := snap.ChangesFrom(h.snap)
	if h.dependents != nil {
		if delta {
			h.dependents.update(h.snap, snap, changed, &h.cfg.Mapping)
		} else {
			h.dependents = nil // made again when needed
		}
	}
	h.snap = snap
	h.shared = nil
	// The changed keys, once for every node: a map the nodes with no other work share.
	keys, owners := changedKeys(changed)
	var nodes []string
	for name, z := range h.nodes {
		prepared := z.prepared == snap
		z.prepared = nil
		if !z.open {
			continue
		}
		if !delta {
			z.full = true
		} else if prepared && h.atRest(name, z, snap) {
			continue // Prepare decided the write for it, and nothing came since
		} else {
			// As reconsider weighs a changed key: it is checked, and so is what waits for it.
			z.addWrite(keys)
			for _, o := range owners {
				z.addWaiting(o, snap.Len())
			}
			if z.checking && !z.full {
				for k := range keys {
					z.arrivals = append(z.arrivals, arrival{key: k, changed: true})
				}
			}
		}
		nodes = append(nodes, name)
	}
	h.mu.Unlock()
	h.enqueue(nodes...)
}

// changedKeys are a write's changed entries (type URL -> names) as keys, and as a list: the
// owners what waits for them is indexed under.
func changedKeys(changed map[string][]string) (keys map[engine.Ref]bool, owners []engine.Ref) {
	keys = map[engine.Ref]bool{}
	for typeURL, names := range changed {
		for _, n := range names {
			k := engine.Ref{TypeURL: typeURL, Name: n}
			keys[k] = true
			owners = append(owners, k)
		}
	}
	return keys, owners
}

// Observer is how Holds hears of stream events: a new stream is checked in full, an ACK (or the
// stored part of a NACK) releases what waited for what it brought, and a closed stream's node is
// kept until Forget.
func (h *Holds) Observer() event.Observer {
	return event.Observer{
		StreamOpened: func(id int64, node string) {
			h.mu.Lock()
			z := h.nodes[node]
			if z == nil {
				z = &nodeHolds{}
				h.nodes[node] = z
			}
			z.stream, z.open, z.full = id, true, true // back within its grace: its verdicts still hold
			z.heard++
			if z.checking {
				z.moved = true // the new stream's inventory starts again from what it reports
			}
			pub := z.pub
			h.mu.Unlock()
			if pub != nil {
				h.cfg.Refresher.Publish(node, pub) // the new session sees what the last one did until checked
			}
			h.enqueue(node)
		},
		ACK: func(a event.ACK) { h.arrived(a.Node, a.TypeURL, a.Versions, a.Removed) },
		NACK: func(n event.NACK) {
			if len(n.Accepted) > 0 {
				h.arrived(n.Node, n.TypeURL, event.VersionsOf(n.Accepted), nil)
			}
		},
		StreamClosed: func(id int64, node string) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if z := h.nodes[node]; z != nil && z.stream == id {
				z.open = false
			}
		},
	}
}

// arrived queues a check of what the resources a node now holds (names: version by xDS name) or
// removed may change (reconsider). It runs on the stream's goroutine: a few index lookups per
// name (and, on the first removal after a snapshot that was not derived from the previous one,
// one walk of the snapshot to index it).
func (h *Holds) arrived(node, typeURL string, names event.Versions, removed []string) {
	h.mu.Lock()
	z := h.nodes[node]
	if z != nil {
		z.heard++
	}
	if z == nil || !z.open || (len(removed) == 0 && !z.checking && !z.holdsBack()) {
		// Nothing held back and nothing being checked: what the node now holds changes no
		// verdict (a removal may: what depends on it was shown). The common ACK costs nothing.
		h.mu.Unlock()
		return
	}
	if z.checking {
		z.moved = true // its check's answer is not shared (shared.go)
	}
	found := false
	if _, own := h.nodeSnapshot(node); own {
		// Checked against its own snapshot: in full, after what it holds changed.
		z.full = true
		h.mu.Unlock()
		h.enqueue(node)
		return
	}
	weigh := func(a arrival) {
		if h.reconsider(z, a) {
			found = true
		}
		if z.checking && !z.full {
			z.arrivals = append(z.arrivals, a)
		}
	}
	for n, version := range names.All() {
		weigh(arrival{key: engine.Ref{TypeURL: typeURL, Name: n}, version: version})
	}
	for _, n := range removed {
		weigh(arrival{key: engine.Ref{TypeURL: typeURL, Name: n}, removed: true})
	}
	h.mu.Unlock()
	if found {
		h.enqueue(node)
	}
}

// arrival is a resource that a node now holds at version, or removed, or that changed in the
// snapshot.
type arrival struct {
	key     engine.Ref
	version string
	removed bool
	changed bool
}

// reconsider gives z the work that an arrival makes, and reports whether it made any. Call with
// h.mu held.
//   - What waits for the resource, or names it as an owner and is held back, is checked again.
//   - A resource held back at the version the node now holds is checked again: a resource held
//     at its version is accepted (see Plan).
//   - What the node was shown that names a removed resource as its owner is checked again: a node
//     without that owner would reject it now.
//   - A resource changed in the snapshot is checked (Changed adds it).
func (h *Holds) reconsider(z *nodeHolds, a arrival) bool {
	found := z.addWaiting(a.key, h.snap.Len())
	switch {
	case a.changed:
		z.addWork(a.key)
		found = true
	case a.removed:
		if h.dependents == nil {
			h.dependents = dependentsOf(h.snap, &h.cfg.Mapping)
		}
		for k := range h.dependents[a.key] {
			if v, ok := z.verdict(k); ok && v.Accepted() {
				z.addWork(k)
				found = true
			}
		}
	default:
		if v, ok := z.verdict(a.key); ok && !v.Accepted() && v.Version == a.version {
			z.addWork(a.key)
			found = true
		}
	}
	return found
}

// Withheld returns what is held back from a node, sorted by key (type URL, then name).
func (h *Holds) Withheld(node string) []Withheld {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []Withheld
	if z := h.nodes[node]; z != nil {
		z.own.each(func(_ engine.Ref, v Verdict) {
			if v.Withheld != nil {
				out = append(out, *v.Withheld)
			}
		})
		if z.table != nil {
			for k, v := range z.table.held {
				if _, over := z.own.get(k); !over {
					out = append(out, *v.Withheld)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Withheld) int {
		return cmp.Or(strings.Compare(a.Key.TypeURL, b.Key.TypeURL), strings.Compare(a.Key.Name, b.Key.Name))
	})
	return out
}

// Withholds reports whether anything is held back from a node, without listing it.
func (h *Holds) Withholds(node string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	z := h.nodes[node]
	if z == nil {
		return false
	}
	if z.ownHeld > 0 { // own verdicts that hold something back, counted as they are set
		return true
	}
	if z.table != nil {
		for k := range z.table.held {
			if _, over := z.own.get(k); !over {
				return true
			}
		}
	}
	return false
}

// Forget frees the verdicts of a node that has no open stream (its grace period is over).
func (h *Holds) Forget(node string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if z := h.nodes[node]; z != nil && !z.open {
		delete(h.nodes, node)
		h.nodes = shrink.Map(h.nodes, &h.peak)
	}
}

// Nodes returns how many nodes Holds keeps verdicts for.
func (h *Holds) Nodes() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.nodes)
}
