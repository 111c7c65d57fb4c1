package guard

// What a change costs: a type's view is made again in full only when what the cache serves of
// it or what the client asks for of it changed, or a response was undone. Otherwise an
// evaluation looks only at the names whose pick may have changed since the view was made
// (typeState.dirty), and finds the view the same, or makes it again. An answer of the client
// marks its names, what waits on them, and the removals they reference.

import (
	"slices"
	"strings"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// reviewIfAsked evaluates, when what the client holds changed (review), each type that has
// something to look at again.
func (s *session) reviewIfAsked() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.review {
		return
	}
	s.review = false
	for _, ts := range s.types {
		if !ts.made || len(ts.dirty) > 0 {
			s.evaluateLocked(ts)
		}
	}
}

// sameViewLocked reports whether the view made for the type's watch is still what the client
// should see, looking only at the names marked since (dirty); it notes what it finds of them in
// the insight. Call with s.mu, with ts.made and the same served.
func (s *session) sameViewLocked(ts *typeState) bool {
	for n := range ts.dirty {
		if ts.forced[n] {
			return false // a retry round sends it: the full view says how
		}
		p := s.pickNameLocked(ts, n)
		if !s.madeHoldsLocked(ts, n, p.it) {
			return false
		}
		s.noteWithheldLocked(ts, n, p)
	}
	ts.dirty = nil
	return true
}

// pickNameLocked is what the client should hold of name (pickOneLocked), which the view has if
// the cache serves it and the client asks for it, or if it is a removal the client keeps
// (viewLocked). Call with s.mu.
func (s *session) pickNameLocked(ts *typeState, name string) pick {
	a := ts.acked.get(name)
	if it := ts.served.get(name); it != nil {
		if s.subscribedLocked(ts, name) {
			return s.pickOneLocked(ts, it, a, "", false)
		}
	} else if a != nil && !s.g.opts.NoHolds && s.subscribedLocked(ts, name) {
		if why := s.keptWhyLocked(ts, name); why != "" {
			return s.pickOneLocked(ts, a, a, why, true)
		}
	}
	s.waitingLocked(ts, name, false)
	return pick{}
}

// madeHoldsLocked reports whether the view made has it of name (nil: not name): the same item
// (SotW's lastView), or the same version (delta's sent view). Call with s.mu.
func (s *session) madeHoldsLocked(ts *typeState, name string, it *item) bool {
	if s.delta {
		sent := ts.sentView.get(name)
		if it == nil || sent == nil {
			return it == sent
		}
		return sent.version == it.version
	}
	i, found := slices.BinarySearchFunc(ts.lastView, name, itemNamed)
	if !found {
		return it == nil
	}
	return ts.lastView[i] == it
}

// noteWithheldLocked puts what p says of name in the type's insight, whose Withheld are in
// name order as a view makes them. Call with s.mu.
func (s *session) noteWithheldLocked(ts *typeState, name string, p pick) {
	ins := s.insight[ts.typeURL]
	i, found := slices.BinarySearchFunc(ins.Withheld, name, func(w Withheld, n string) int { return strings.Compare(w.Name, n) })
	switch {
	case p.withheld && found:
		ins.Withheld[i] = p.why
	case p.withheld:
		ins.Withheld = slices.Insert(ins.Withheld, i, p.why)
	case found:
		ins.Withheld = slices.Delete(ins.Withheld, i, i+1)
	}
}

// sentForced notes that a response carries name: a retry round no longer forces it, and what
// the client should hold of it is looked at again (a version it refused is held back again).
// Call with s.mu.
func sentForced(ts *typeState, name string) {
	if ts.forced[name] {
		delete(ts.forced, name)
		markLocked(ts, name)
	}
}

// markLocked marks name of ts to be looked at again. Call with s.mu.
func markLocked(ts *typeState, name string) {
	if ts.dirty == nil {
		ts.dirty = map[string]struct{}{}
	}
	ts.dirty[name] = struct{}{}
}

// heldChangedLocked marks what may see differently now that what the client holds of some
// names of ts changed (was: what it held of each before, nil for nothing): the names
// themselves, the names of any type that wait and depend on one (dependsLocked), and the names
// their old and new versions reference (a removal kept while something references it). Call
// with s.mu.
func (s *session) heldChangedLocked(ts *typeState, was map[string]*item) {
	if len(was) == 0 {
		return
	}
	changed := make(map[Ref]struct{}, len(was))
	for n, old := range was {
		markLocked(ts, n)
		changed[Ref{TypeURL: ts.typeURL, Name: n}] = struct{}{}
		for _, it := range [2]*item{old, ts.acked.get(n)} {
			if it == nil {
				continue
			}
			for _, r := range it.refs {
				if rts := s.types[r.TypeURL]; rts != nil {
					markLocked(rts, r.Name)
				}
			}
		}
	}
	for _, u := range s.types {
		for m := range u.waiting {
			if s.dependsLocked(u, m, changed) {
				markLocked(u, m)
			}
		}
	}
}

// dependsLocked reports whether the pick of name, served of u, depends on what the client
// holds of one of on: it references one, or, for a route, the cluster it references that the
// client holds does (withholdLocked). Call with s.mu.
func (s *session) dependsLocked(u *typeState, name string, on map[Ref]struct{}) bool {
	it := u.served.get(name)
	if it == nil {
		return false // a removal kept: what references it marks it (heldChangedLocked)
	}
	for _, r := range it.refs {
		if _, ok := on[r]; ok {
			return true
		}
		if u.typeURL != resource.RouteType {
			continue
		}
		if rts := s.types[r.TypeURL]; rts != nil {
			if a := rts.acked.get(r.Name); a != nil {
				for _, rr := range a.refs {
					if _, ok := on[rr]; ok {
						return true
					}
				}
			}
		}
	}
	return false
}

// serveLocked makes sv what the cache serves of the type: its view is made again at its next
// evaluation, what waits in other types looks again (a route may wait for what a cluster it
// references references, pendingRefsLocked), and the verdicts of names no longer served go.
// Call with s.mu.
func (s *session) serveLocked(ts *typeState, sv *served) {
	ts.served = sv
	s.waitersChangedLocked(ts)
	s.goneVerdictsLocked(ts)
}

// waitersChangedLocked marks every name that waits, of every type but except (nil: all): what
// they wait on changed in a way an answer does not say (what another type serves, or what the
// client asks for). Call with s.mu.
func (s *session) waitersChangedLocked(except *typeState) {
	for _, u := range s.types {
		if u == except {
			continue
		}
		for m := range u.waiting {
			markLocked(u, m)
		}
	}
}

// subChangedLocked reports whether sub, a new watch's, asks for other names of the type than the
// view was made for: a delta request said so (asked), or a SotW request lists other names. Call
// with s.mu.
func (s *session) subChangedLocked(ts *typeState, sub cache.Subscription) bool {
	if ts.sub == nil {
		return true
	}
	if ts.asked || ts.sub.IsWildcard() != sub.IsWildcard() {
		return true
	}
	if s.delta {
		return false // the server's subscription changes in place: a request says what it changed
	}
	was, now := ts.sub.SubscribedResources(), sub.SubscribedResources()
	if len(was) != len(now) {
		return true
	}
	for n := range now {
		if _, ok := was[n]; !ok {
			return true
		}
	}
	return false
}
