package guard

import "iter"

// holding is what a client accepted of a type, by name. A client that accepted everything a
// served shared by every stream holds (a feed's) keeps that served's own map, which never
// changes, as its base, and in over what it accepted since, by name (nil: not held): ten
// thousand clients in step cost one map, not ten thousand. Any other keeps a map of its own
// (over, with no base). The zero holding holds nothing.
//
// Who references a name (referrer) is answered from an index: base's is its served's (made
// once for every holding of it), over's is the holding's own, made at the first question and
// kept as over changes.
type holding struct {
	base    map[string]*item
	baseOf  *served // the served whose map base is
	over    map[string]*item
	n       int      // names held
	changed int      // names set since settle last looked
	byRef   refIndex // over's items by what they reference; nil until referrer is first asked
}

// refIndex is names by what their items reference.
type refIndex map[Ref]map[string]struct{}

func (x refIndex) add(name string, it *item) {
	for _, r := range it.refs {
		names := x[r]
		if names == nil {
			names = map[string]struct{}{}
			x[r] = names
		}
		names[name] = struct{}{}
	}
}

func (x refIndex) remove(name string, it *item) {
	for _, r := range it.refs {
		if names := x[r]; names != nil {
			delete(names, name)
			if len(names) == 0 {
				delete(x, r)
			}
		}
	}
}

// get is what the client holds of name, or nil.
func (h *holding) get(name string) *item {
	if it, ok := h.over[name]; ok {
		return it
	}
	return h.base[name]
}

// len is the number of names held.
func (h *holding) len() int { return h.n }

// set records what the client holds of name (nil: nothing).
func (h *holding) set(name string, it *item) {
	if h.get(name) != nil {
		h.n--
	}
	if it != nil {
		h.n++
	}
	h.changed++
	if old := h.over[name]; old != nil && h.byRef != nil {
		h.byRef.remove(name, old)
	}
	if h.base != nil && h.base[name] == it || h.base == nil && it == nil {
		delete(h.over, name)
		return
	}
	if h.over == nil {
		h.over = map[string]*item{}
	}
	h.over[name] = it
	if it != nil && h.byRef != nil {
		h.byRef.add(name, it)
	}
}

// referrer is the first name, in name order, of what the client holds that references ref.
// It costs what references ref, and, the first time, a walk of over.
func (h *holding) referrer(ref Ref) (string, bool) {
	name, found := "", false
	for _, n := range h.baseOf.referrers(ref) {
		if _, changed := h.over[n]; !changed {
			name, found = n, true // base's are in name order
			break
		}
	}
	if h.byRef == nil {
		h.byRef = refIndex{}
		for n, it := range h.over {
			if it != nil {
				h.byRef.add(n, it)
			}
		}
	}
	for n := range h.byRef[ref] {
		if !found || n < name {
			name, found = n, true
		}
	}
	return name, found
}

// all is every name held, with what is held of it, in no order.
func (h *holding) all() iter.Seq2[string, *item] {
	return func(yield func(string, *item) bool) {
		for n, it := range h.base {
			if _, changed := h.over[n]; !changed && !yield(n, it) {
				return
			}
		}
		for n, it := range h.over {
			if it != nil && !yield(n, it) {
				return
			}
		}
	}
}

// own makes the client hold nothing, in a map of its own grown for hint names.
func (h *holding) own(hint int) {
	*h = holding{over: make(map[string]*item, hint)}
}

// holdServed makes the client hold everything sv (a shared served) holds, and nothing else.
func (h *holding) holdServed(sv *served) {
	*h = holding{base: sv.byName, baseOf: sv, n: len(sv.byName)}
}

// holdsWithin reports whether every name held is one sv holds.
func (h *holding) holdsWithin(sv *served) bool {
	if h.n > len(sv.byName) {
		return false
	}
	for n := range h.all() {
		if sv.byName[n] == nil {
			return false
		}
	}
	return true
}

// settle keeps what differs small, and takes a shared map where it can. Once more names were
// set than a sixteenth of those held (at least 8) since it last looked, the client holds sv's
// own map as its base if what it holds is exactly what sv (a shared served) holds: a client in
// step with its feed settles on the feed's newest map, at the cost of one walk of it every
// sixteenth of its names changed, whether it held a base before or a map of its own (a delta
// client that came back holding what it had). If not (an answer still to come, a version
// refused), it looks again after as many more, and takes a map of its own once what differs
// from base is half as large as base.
func (h *holding) settle(sv *served) {
	if h.changed <= max(8, h.n/16) {
		return
	}
	switch {
	case sv != nil && sv.anys != nil && h.n == len(sv.sorted) && h.holdsAll(sv.sorted):
		h.holdServed(sv)
	case h.base != nil && len(h.over) > len(h.base)/2:
		own := make(map[string]*item, h.n)
		for n, it := range h.all() {
			own[n] = it
		}
		*h = holding{over: own, n: len(own)}
	default:
		h.changed = 0
	}
}

// holdsAll reports whether the client holds each of items.
func (h *holding) holdsAll(items []*item) bool {
	for _, it := range items {
		if h.get(it.name) != it {
			return false
		}
	}
	return true
}
