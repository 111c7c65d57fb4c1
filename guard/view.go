package guard

// What a client should see of a type (its view): what the wrapped cache serves that it asks for,
// less what it refused and what waits for what it references, and the response that answers the
// type's watch when the view changed.

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/internal/shrink"
)

// evaluateLocked answers the type's open watch when what the client should see differs from
// what it was last sent. Call with s.mu.
func (s *session) evaluateLocked(ts *typeState) {
	w := ts.w
	if w == nil || ts.served == nil {
		return
	}
	defer s.checkOwnersLocked() // what the view found without an owner verdict
	if ts.made && ts.madeServed == ts.served && s.sameViewLocked(ts) {
		return // nothing new: the watch stays open
	}
	buf := views.Get().(*[]*item)
	defer views.Put(buf)
	items, forced := s.viewLocked(ts, (*buf)[:0])
	*buf = items[:0] // what it grew to, for the next view
	if ts.seq == 0 && slices.ContainsFunc(s.insight[ts.typeURL].Withheld, func(w Withheld) bool { return w.Reason == ownerPending }) {
		ts.made = false
		return // the type's first response waits for the first owner check
	}
	// From here the view made is what lastView (SotW) or sentView (delta) holds.
	ts.made, ts.madeServed, ts.dirty = true, ts.served, nil
	if s.delta {
		s.respondDeltaLocked(ts, w, items)
		return
	}
	// An item is one version of one name (the item cache hands out one per content), so the
	// same items are the same view.
	if slices.Equal(items, ts.lastView) && !forced && ts.seq > 0 {
		return // nothing new: the watch stays open
	}
	view := ts.served.sorted // everything a shared served holds: its own slice, which never changes
	if !ts.served.holdsAll(items) {
		view = slices.Clone(items) // items is the buffer's
	}
	items = view
	// A type whose SotW response is not the client's whole state (all but Listeners and
	// Clusters) gets what changed, as go-control-plane's caches send it: the names whose version
	// the client has not accepted, and those a retry round forces. Its first response, and the
	// first after the client asked for other names, carry the whole view.
	var sub string
	partial := false
	if !fullState(ts.typeURL) {
		sub = subscriptionKey(w.sub)
		partial = ts.seq > 0 && sub == ts.lastSub
	}
	if partial {
		changed := make([]*item, 0, 1)
		for _, it := range items {
			if a := ts.acked.get(it.name); a == nil || a.version != it.version || ts.forced[it.name] {
				changed = append(changed, it)
			}
		}
		items = changed
	}
	for _, it := range items {
		sentForced(ts, it.name)
	}
	ts.lastView, ts.lastSub = view, sub
	if partial && len(items) == 0 {
		return // the view lost a name, which such a response cannot say: the watch stays open
	}
	ts.seq++
	resp := &discovery.DiscoveryResponse{VersionInfo: fmt.Sprintf("%s.%d", ts.served.version, ts.seq), TypeUrl: ts.typeURL}
	f := &flight{resp: resp, items: items}
	if ts.served.whole(items) {
		resp.Resources, f.whole = ts.served.anys, ts.served // shared by every stream's response of them
	} else {
		resp.Resources = make([]*anypb.Any, len(items))
		for i, it := range items {
			resp.Resources[i] = it.any
		}
	}
	s.addFlightLocked(ts, f)
	ts.w = nil
	s.outq = append(s.outq, queued{w: w, ts: ts, f: f, resp: &response{req: w.req, resp: resp}})
}

// subscriptionKey names what a SotW client asks for: "*" for every resource of the type, else
// its names, sorted.
func subscriptionKey(sub cache.Subscription) string {
	if sub.IsWildcard() {
		return "*"
	}
	names := make([]string, 0, len(sub.SubscribedResources()))
	for n := range sub.SubscribedResources() {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

func (s *session) addFlightLocked(ts *typeState, f *flight) {
	ts.flight = append(ts.flight, f)
	if len(ts.flight) > maxFlight {
		ts.flight = ts.flight[1:]
	}
}

// viewLocked is what the client should hold of the type now, by name (sorted), appended to
// into, and whether a name in it is forced (a retry round sends it although nothing changed).
// Call with s.mu.
func (s *session) viewLocked(ts *typeState, into []*item) (items []*item, forced bool) {
	w := ts.w
	var view []*item // what the cache serves that the client asks for, sorted by name
	if w.sub.IsWildcard() {
		view = slices.Clip(ts.served.sorted) // an append below copies it
	} else {
		for n := range w.sub.SubscribedResources() {
			if it := ts.served.get(n); it != nil {
				view = append(view, it)
			}
		}
		slices.SortFunc(view, byItemName)
	}
	items, forced, held := s.pickLocked(ts, view, nil, into)
	// Names the client holds and the cache no longer serves are removed, but not while something
	// else the client holds references them (break after make: an old route's cluster stays
	// until the client has the route that no longer names it), nor, for some types, while the
	// client still asks for them by name (keptWhileAsked). There are such names only when the
	// client holds more than the view's names.
	if held == ts.acked.len() || s.g.opts.NoHolds {
		return items, forced
	}
	var kept map[string]string
	for n, a := range ts.acked.all() {
		if ts.served.get(n) != nil || !s.subscribedLocked(ts, n) {
			continue
		}
		why := s.keptWhyLocked(ts, n)
		if why == "" {
			continue
		}
		if kept == nil {
			kept = map[string]string{}
		}
		kept[n] = why
		view = append(view, a)
	}
	if kept == nil {
		return items, forced
	}
	slices.SortFunc(view, byItemName)
	items, forced, _ = s.pickLocked(ts, view, kept, into)
	return items, forced
}

// keptWhyLocked says why the client keeps name, which it holds and asks for and the cache no
// longer serves, or "": it is removed. Call with s.mu.
func (s *session) keptWhyLocked(ts *typeState, name string) string {
	if by := s.referencedByLocked(ts.typeURL, name); by != "" {
		return "removed, kept while the client holds " + by + ", which references it"
	}
	if !ts.sub.IsWildcard() && keptWhileAsked(ts.typeURL) {
		return "removed, kept while the client asks for it"
	}
	return ""
}

// keptWhileAsked reports whether a removed name of the type is kept while the client asks for
// it by name, though nothing it holds references it: grpc-go asks for a cluster until its last
// RPC on it is done, though its route no longer names it. Not a Listener, which nothing
// references, nor a load assignment, which a client asks for only for the cluster that
// references it: it goes once the client no longer holds the cluster, whether or not it still
// asks for it (Istio's delta client never unsubscribes from one).
func keptWhileAsked(typeURL string) bool {
	return typeURL != resource.ListenerType && typeURL != resource.EndpointType
}

// pickLocked is what the client should hold of each of view's items, appended to into: the
// item, what it holds instead (a version held back, or kept: a name no longer served, with why),
// or nothing. It reports whether one is forced, and how many of view's names the client holds.
// It notes what it holds back in the type's insight, and which names wait (waiting). Call with
// s.mu.
func (s *session) pickLocked(ts *typeState, view []*item, kept map[string]string, into []*item) (items []*item, forced bool, held int) {
	ins := s.insight[ts.typeURL]
	ins.Withheld = ins.Withheld[:0]
	ts.waiting, ts.waitingPeak = nil, shrink.Peak{}
	items = slices.Grow(into[:0], len(view))
	for _, it := range view {
		a := ts.acked.get(it.name)
		if a != nil {
			held++
		}
		why, isKept := kept[it.name]
		p := s.pickOneLocked(ts, it, a, why, isKept)
		if p.withheld {
			ins.Withheld = append(ins.Withheld, p.why)
		}
		forced = forced || p.forced
		if p.it != nil {
			items = append(items, p.it)
		}
	}
	return items, forced, held
}

// pick is what the client should hold of one name: it (nil: nothing), whether it is withheld
// and why, and whether a retry round forces it.
type pick struct {
	it       *item
	why      Withheld
	withheld bool
	forced   bool
}

// pickOneLocked is what the client should hold of it's name, which it holds as a (nil: not):
// it, what it holds instead, or nothing; kept says it is a removal the client keeps (it is what
// it holds), and why. A name whose pick depends on more than its own version (the client does
// not hold it at the version served, or keeps it removed) is noted in ts.waiting. Call with s.mu.
func (s *session) pickOneLocked(ts *typeState, it, a *item, keptWhy string, kept bool) pick {
	n := it.name
	if kept {
		s.waitingLocked(ts, n, true)
		return pick{it: it, why: Withheld{Name: n, Reason: keptWhy}, withheld: true} // it is what the client holds
	}
	if a != nil && a.version == it.version {
		s.waitingLocked(ts, n, false)
		return pick{it: it} // the client has this very version: nothing to hold back
	}
	s.waitingLocked(ts, n, true)
	if why, warm := s.withholdLocked(ts, it); why != "" {
		p := pick{it: a, why: Withheld{Name: n, Version: it.version, Reason: why}, withheld: true} // the client keeps what it has, if anything
		if a != nil && len(warm) > 0 {
			p.it = s.warmLocked(ts, a, warm)
		}
		return p
	}
	return pick{it: it, forced: ts.forced[n]}
}

// waitingLocked notes whether name waits (pickOneLocked). Call with s.mu.
func (s *session) waitingLocked(ts *typeState, name string, waits bool) {
	if waits {
		if ts.waiting == nil {
			ts.waiting = map[string]struct{}{}
		}
		ts.waiting[name] = struct{}{}
	} else {
		delete(ts.waiting, name)
	}
	// A map keeps its room once emptied: what waits is walked after every answer.
	ts.waiting = shrink.Map(ts.waiting, &ts.waitingPeak)
}

// views are the buffers views are made in: a view is copied only when it differs from the one
// last sent, which it seldom does (a view is made when what is served or asked for changed, or
// a name marked since changed it).
var views = sync.Pool{New: func() any { return new([]*item) }}

func byItemName(a, b *item) int { return strings.Compare(a.name, b.name) }

func itemNamed(it *item, name string) int { return strings.Compare(it.name, name) }

// withholdLocked says why the client should not get it now, or "". warm are the clusters a
// route configuration waits for that the client does not ask for yet: a client that asks for
// clusters by name, once a route names them (grpc-go), is made to ask for them with the route
// configuration it holds (warmLocked), so that it can accept them before the new version of the
// route sends traffic to them (make-before-break).
func (s *session) withholdLocked(ts *typeState, it *item) (why string, warm []string) {
	if r, ok := ts.refused[it.name]; ok && r.version == it.version && !ts.forced[it.name] {
		return "refused by the client: " + r.reason, nil
	}
	if s.g.opts.NoHolds {
		return s.ownerWithholdLocked(ts, it), nil
	}
	var waiting []string
	for _, ref := range it.refs {
		rts := s.types[ref.TypeURL]
		if rts != nil {
			if a := rts.acked.get(ref.Name); a != nil {
				// A route's cluster: and what the cluster references in turn (its endpoints),
				// when served.
				if ts.typeURL == resource.RouteType {
					if w := s.pendingRefsLocked(a); w != "" {
						waiting = append(waiting, w)
					}
				}
				continue
			}
		}
		what := fmt.Sprintf("%s %q", shortType(ref.TypeURL), ref.Name)
		if rts != nil {
			if r, ok := rts.refused[ref.Name]; ok {
				what += " (it refused it: " + r.reason + ")"
			}
		}
		switch {
		case rts != nil && s.subscribedLocked(rts, ref.Name):
			waiting = append(waiting, what)
		case rts != nil && ts.typeURL == resource.RouteType && ref.TypeURL == resource.ClusterType && ts.acked.get(it.name) != nil:
			waiting = append(waiting, what)
			warm = append(warm, ref.Name)
		default:
			// The client does not ask for it, and nothing it holds can make it: not waited for.
		}
	}
	if len(waiting) == 0 {
		return s.ownerWithholdLocked(ts, it), nil
	}
	return "waiting for the client to accept " + strings.Join(waiting, ", "), warm
}

// referencedByLocked names a resource the client holds that references name of typeURL (the
// first by type URL, then name), or "". It costs what references it (holding.referrer). Call
// with s.mu.
func (s *session) referencedByLocked(typeURL, name string) string {
	want := Ref{TypeURL: typeURL, Name: name}
	var by *typeState
	byName := ""
	for _, ts := range s.types {
		if n, ok := ts.acked.referrer(want); ok && (by == nil || ts.typeURL < by.typeURL) {
			by, byName = ts, n
		}
	}
	if by == nil {
		return ""
	}
	return fmt.Sprintf("%s %q", shortType(by.typeURL), byName)
}

// pendingRefsLocked names what a (accepted) resource references that the server serves and the
// client has not accepted yet, or "". The client asks for those once it has the resource (a
// cluster's endpoints), so it is waited for whether or not it asked yet. Call with s.mu.
func (s *session) pendingRefsLocked(a *item) string {
	var out []string
	for _, ref := range a.refs {
		rts := s.types[ref.TypeURL]
		if rts == nil {
			continue // the client has not asked for any of the type: nothing to know
		}
		if rts.acked.get(ref.Name) != nil {
			continue
		}
		if rts.served.get(ref.Name) != nil {
			out = append(out, fmt.Sprintf("%s %q", shortType(ref.TypeURL), ref.Name))
		}
	}
	return strings.Join(out, ", ")
}

// subscribedLocked reports whether the client asks for name of the type.
func (s *session) subscribedLocked(ts *typeState, name string) bool {
	if ts.sub == nil {
		return false
	}
	if ts.sub.IsWildcard() {
		return true
	}
	_, ok := ts.sub.SubscribedResources()[name]
	return ok
}

func shortType(typeURL string) string {
	if i := strings.LastIndexByte(typeURL, '.'); i >= 0 {
		return typeURL[i+1:]
	}
	return typeURL
}
