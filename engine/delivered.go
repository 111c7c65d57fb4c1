package engine

import (
	"slices"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// delivered is what a node was sent of one type, name -> the response's Resource: a snapshot's
// entries of the type (base), shared by every stream that was sent exactly those, under the names
// that differ from them (over; a nil value: a name of base the node does not hold). A stream that
// holds what is served costs no map of its own, whatever the type's size.
//
// Invariants:
//   - The names delivered holds are base's names without over's nil ones, and over's non-nil
//     ones; n counts them. base is read-only (a snapshot's), over is the stream's.
//   - over never holds a name at the value base gives it.
type delivered struct {
	snap *Snapshot         // the snapshot base is the type of, for rebase
	base map[string]*Entry // nil: none
	over map[string]*discovery.Resource
	n    int
	// compared is how big over was when rebase last compared every name (no lineage to follow):
	// it compares again once over has doubled, so the walks cost O(1) a change.
	compared int
}

func (d *delivered) get(name string) (*discovery.Resource, bool) {
	if r, ok := d.over[name]; ok {
		return r, r != nil
	}
	if e := d.base[name]; e != nil {
		return e.Wire, true
	}
	return nil, false
}

func (d *delivered) len() int { return d.n }

func (d *delivered) set(name string, r *discovery.Resource) {
	if _, had := d.get(name); !had {
		d.n++
	}
	if e := d.base[name]; e != nil && e.Wire == r {
		delete(d.over, name)
		return
	}
	if d.over == nil {
		d.over = map[string]*discovery.Resource{}
	}
	d.over[name] = r
}

func (d *delivered) drop(name string) {
	if _, had := d.get(name); !had {
		return
	}
	d.n--
	if d.base[name] != nil {
		if d.over == nil {
			d.over = map[string]*discovery.Resource{}
		}
		d.over[name] = nil
		return
	}
	delete(d.over, name)
}

// each calls f with every name delivered holds; f must not change d.
func (d *delivered) each(f func(name string, r *discovery.Resource)) {
	for n, e := range d.base {
		if r, ok := d.over[n]; ok {
			if r != nil {
				f(n, r)
			}
			continue
		}
		f(n, e.Wire)
	}
	for n, r := range d.over {
		if r != nil && d.base[n] == nil {
			f(n, r)
		}
	}
}

// rebase makes the type's entries of cur the base when d holds exactly them: then over is emptied,
// and the stream shares cur's entries again. It tells by the names that changed when cur is
// derived from d's base snapshot (Snapshot.Update), or by every name when d has no base,
// or, without lineage, once over has grown to twice its size at the last such comparison.
func (d *delivered) rebase(cur *Snapshot, kind string) {
	if cur == nil || cur == d.snap {
		return
	}
	entries := cur.Type(kind)
	switch ch, ok := cur.ChangesFrom(d.snap); {
	case ok:
		for _, n := range ch[kind] {
			if _, in := d.over[n]; !in {
				return // a name changed since base that d still holds at base's value, or lacks
			}
		}
	case d.base == nil && d.n == len(entries):
		// No base: d holds cur's entries if each of its names (all in over) is cur's.
	case len(d.over) >= 8 && len(d.over) >= 2*d.compared && d.n == len(entries):
		// No lineage (the snapshot moved on more than once since base): compare every name.
		d.compared = len(d.over)
		for n, e := range entries {
			if r, ok := d.get(n); !ok || r != e.Wire {
				return
			}
		}
	default:
		return
	}
	for n, r := range d.over {
		e := entries[n]
		if (r == nil) != (e == nil) || (e != nil && e.Wire != r) {
			return
		}
	}
	d.share(cur, entries)
}

// advance makes d hold cur's entries of the type when d holds its base's exactly and a response
// carries exactly what changed of the type from that base to cur (resources at cur's entries,
// removed names that cur no longer has): a write, sent to a stream in step. It reports whether
// it did; d is unchanged when it did not. It spares the map that set would make only for rebase
// to drop it.
func (d *delivered) advance(cur *Snapshot, kind string, resources []*discovery.Resource, removed []string) bool {
	if len(d.over) > 0 || d.base == nil || cur == d.snap {
		return false
	}
	ch, ok := cur.ChangesFrom(d.snap)
	names := ch[kind]
	if !ok || len(names) != len(resources)+len(removed) || len(names) > 16 { // a write's few: scans
		return false
	}
	entries := cur.Type(kind)
	for _, r := range resources {
		if e := entries[r.Name]; e == nil || e.Wire != r || !slices.Contains(names, r.Name) {
			return false
		}
	}
	for _, n := range removed {
		if entries[n] != nil || !slices.Contains(names, n) {
			return false
		}
	}
	d.share(cur, entries)
	return true
}

// share makes d's names cur's entries of the type, with none of its own.
func (d *delivered) share(cur *Snapshot, entries map[string]*Entry) {
	d.snap, d.base, d.compared, d.n = cur, entries, 0, len(entries)
	d.over = nil // not cleared: its buckets would stay
}

// sentAll makes an empty d hold rs when rs are exactly the type's entries of cur in name order
// (a stream's first response of a type, most often), without a map: it reports whether it did.
func (d *delivered) sentAll(cur *Snapshot, kind string, rs []*discovery.Resource) bool {
	if d.n != 0 || len(rs) == 0 || len(rs) != len(cur.Type(kind)) {
		return false
	}
	if ko := cur.order(kind); !ko.isAll(rs) {
		for i, e := range ko.entries {
			if e.Wire != rs[i] {
				return false
			}
		}
	}
	d.share(cur, cur.Type(kind))
	return true
}

// priorSet is name -> version: a few pairs in a slice (a response to an update carries one or two
// names), a map once there are more.
type priorSet struct {
	few  []namedVersion
	many map[string]string
	one  [1]namedVersion // few's first room: an update's one name costs no allocation (never copied once set)
}

type namedVersion struct{ name, version string }

// priorSetFew is how many names a priorSet keeps in its slice.
const priorSetFew = 8

func (p *priorSet) get(name string) (string, bool) {
	if p.many != nil {
		v, ok := p.many[name]
		return v, ok
	}
	for _, nv := range p.few {
		if nv.name == name {
			return nv.version, true
		}
	}
	return "", false
}

func (p *priorSet) empty() bool { return len(p.few) == 0 && len(p.many) == 0 }

func (p *priorSet) set(name, version string) {
	if p.many != nil {
		p.many[name] = version
		return
	}
	for i := range p.few {
		if p.few[i].name == name {
			p.few[i].version = version
			return
		}
	}
	if len(p.few) < priorSetFew {
		if p.few == nil {
			p.few = p.one[:0]
		}
		p.few = append(p.few, namedVersion{name, version})
		return
	}
	p.many = make(map[string]string, 2*priorSetFew)
	for _, nv := range p.few {
		p.many[nv.name] = nv.version
	}
	p.many[name] = version
	p.few = nil
}

func (p *priorSet) del(name string) {
	if p.many != nil {
		delete(p.many, name)
		return
	}
	p.few = slices.DeleteFunc(p.few, func(nv namedVersion) bool { return nv.name == name })
}

func (p *priorSet) each(f func(name string)) {
	for n := range p.many {
		f(n)
	}
	for _, nv := range p.few {
		f(nv.name)
	}
}
