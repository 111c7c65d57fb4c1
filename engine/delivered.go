package engine

import (
	"slices"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// delivered is what a node was sent of one type, name -> the response's Resource: a snapshot's
// entries of the type (base, read-only, shared by every stream sent exactly those) under the
// stream's own names that differ from them (over; a nil value: a name of base the node does not
// hold). Invariants: n counts the names held; over never holds a name at base's value.
type delivered struct {
	snap     *Snapshot         // the snapshot base is the type of, for rebase
	base     map[string]*Entry // nil: none
	over     map[string]*discovery.Resource
	n        int
	compared int // len(over) when rebase last compared every name; it compares again once over doubles
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
		if _, ok := d.over[n]; !ok {
			f(n, e.Wire)
		}
	}
	for n, r := range d.over {
		if r != nil {
			f(n, r)
		}
	}
}

// rebase makes the type's entries of cur the base, over emptied, when d holds exactly them. It
// compares the names that changed when cur derives from d's base snapshot, else every name.
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
	case d.base == nil && d.n == len(entries): // no base: every name is in over
	case len(d.over) >= 8 && len(d.over) >= 2*d.compared && d.n == len(entries): // no lineage
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

// advance makes d hold cur's entries of the type, and reports true, when d holds its base's exactly
// and a response carries exactly what changed of the type from base to cur (advances).
func (d *delivered) advance(cur *Snapshot, kind string, resources []*discovery.Resource, removed []string) bool {
	if !d.advances(cur, kind, resources, removed) {
		return false
	}
	d.share(cur, cur.Type(kind))
	return true
}

// advances reports whether advance would make d hold cur's entries of the type.
func (d *delivered) advances(cur *Snapshot, kind string, resources []*discovery.Resource, removed []string) bool {
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
	return true
}

// share makes d's names cur's entries of the type, with none of its own.
func (d *delivered) share(cur *Snapshot, entries map[string]*Entry) {
	d.snap, d.base, d.compared, d.n = cur, entries, 0, len(entries)
	d.over = nil // not cleared: its buckets would stay
}

// sentAll makes an empty d hold rs when rs are exactly the type's entries of cur in name order,
// and reports whether it did.
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

// priorSet is name -> version: a few pairs in a slice, a map once there are more.
type priorSet struct {
	few  []namedVersion
	many map[string]string
	one  [1]namedVersion // few's first room, so one name costs no allocation (never copied once set)
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
