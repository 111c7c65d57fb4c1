package owner

// A node's own verdicts as a chain of maps, and the view of them a node's session reads.
//
// Invariants:
//   - ownLayers.top is written only by the worker checking the node, under Holds.mu; frozen
//     maps are never written again, so a published view that shares them reads them without
//     a lock.
//   - A node's published view is its verdicts as of its last check: the session's filter reads
//     it (engine.Cache.Publish) with no lock of Holds, so no lock is taken across packages on the
//     hot path.

import (
	"maps"
	"slices"

	"github.com/kds-host/kds-host/engine"
)

// maxLayers is how many frozen maps a node's own verdicts keep before they are merged into one
// (a check that is not full adds one).
const maxLayers = 8

// ownLayers is a node's own verdicts (what checks of some entries decided since the last full
// check): newest first, the map the current check writes (top), then the maps earlier checks
// wrote, read-only once a view was published with them.
type ownLayers struct {
	top    Verdicts
	frozen []Verdicts
	n      int // distinct keys
}

// ownOf is own verdicts v, frozen (tests).
func ownOf(v Verdicts) ownLayers {
	if len(v) == 0 {
		return ownLayers{}
	}
	return ownLayers{frozen: []Verdicts{v}, n: len(v)}
}

func (o *ownLayers) get(k engine.Ref) (Verdict, bool) {
	if v, ok := o.top[k]; ok {
		return v, true
	}
	return layersGet(o.frozen, k)
}

func layersGet(frozen []Verdicts, k engine.Ref) (Verdict, bool) {
	for _, l := range frozen {
		if v, ok := l[k]; ok {
			return v, true
		}
	}
	return Verdict{}, false
}

func (o *ownLayers) set(k engine.Ref, v Verdict) {
	if _, had := o.get(k); !had {
		o.n++
	}
	if o.top == nil {
		o.top = Verdicts{}
	}
	o.top[k] = v
}

func (o *ownLayers) len() int { return o.n }

// each calls f with every key's verdict, once.
func (o *ownLayers) each(f func(k engine.Ref, v Verdict)) {
	seen := make(map[engine.Ref]bool, o.n)
	for _, l := range append([]Verdicts{o.top}, o.frozen...) {
		for k, v := range l {
			if !seen[k] {
				seen[k] = true
				f(k, v)
			}
		}
	}
}

// freeze ends the current check's writes: top joins the frozen maps (merged into one when there
// are more than maxLayers), and the frozen chain is returned for a view to share.
func (o *ownLayers) freeze() []Verdicts {
	if len(o.top) > 0 {
		o.frozen = append([]Verdicts{o.top}, o.frozen...) // a new slice: views share the old one
		o.top = nil
	}
	if len(o.frozen) > maxLayers {
		merged := make(Verdicts, o.n)
		for i := len(o.frozen) - 1; i >= 0; i-- {
			maps.Copy(merged, o.frozen[i])
		}
		o.frozen = []Verdicts{merged}
	}
	return o.frozen
}

// Published is what a node may see as of its last check, read-only: the engine.View that Holds
// publishes into the node's session.
type Published struct {
	own   []Verdicts
	table *table
	base  *engine.Snapshot
	seq   uint64
}

var _ engine.View = (*Published)(nil)

// Visible implements engine.View: an entry is visible at the version of an accepted verdict.
func (p *Published) Visible(e *engine.Entry) bool {
	v, ok := p.verdict(refOfEntry(e))
	return ok && v.Accepted() && v.Version == e.Version
}

// None implements engine.View: no verdict at all yet (the node's first check has not answered).
func (p *Published) None() bool { return p.base == nil && p.table == nil && len(p.own) == 0 }

// SeesAll implements engine.View: a view of snap with no verdict of its own and none held in
// its table accepts every entry of snap at its version (below), as after a full check that held
// nothing back.
func (p *Published) SeesAll(snap *engine.Snapshot) bool {
	return p.base == snap && snap != nil && (p.table == nil || len(p.table.held) == 0) && !slices.ContainsFunc(p.own, func(v Verdicts) bool { return len(v) > 0 })
}

// Seq implements engine.View: later views of a node have larger ones.
func (p *Published) Seq() uint64 { return p.seq }

func (p *Published) verdict(k engine.Ref) (Verdict, bool) {
	if v, ok := layersGet(p.own, k); ok {
		return v, true
	}
	return below(p.table, p.base, k)
}

// publishLocked makes the node's view of its verdicts now, numbered seq (Holds numbers every
// view it makes, so a node forgotten and back never has a view older than one it had). Call with
// Holds.mu, after a check changed them.
func (z *nodeHolds) publishLocked(seq uint64) *Published {
	z.pub = &Published{own: z.own.freeze(), table: z.table, base: z.base, seq: seq}
	return z.pub
}
