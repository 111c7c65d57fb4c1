package guard

// The delta server's side of a session: a response carries what differs from what the client
// was sent and keeps (the sent view), made from the same view as a state-of-the-world response.

import (
	"slices"
	"strings"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// deltaID is the guard's id of a delta stream: the delta server numbers its streams apart from
// the state-of-the-world server, so the guard negates them.
func deltaID(id int64) int64 { return -id }

// CreateDeltaWatch implements cache.ConfigWatcher for the delta server.
func (g *Guard) CreateDeltaWatch(req *discovery.DeltaDiscoveryRequest, sub cache.Subscription, out chan cache.DeltaResponse) (func(), error) {
	s, err := take(g, g.deltaRequests, req)
	if err != nil {
		return nil, err
	}
	return s.watch(&watch{deltaReq: req, deltaOut: out, sub: sub}, req.GetTypeUrl(), req.GetNode())
}

// respondDeltaLocked answers the delta watch w with what items (the view, sorted by name)
// changes of what the client was sent, if anything. Call with s.mu.
func (s *session) respondDeltaLocked(ts *typeState, w *watch, items []*item) {
	if !ts.seeded {
		// What the client says it holds (initial_resource_versions, on a new stream): it has
		// those, where they are the versions served.
		ts.seeded = true
		was := map[string]*item{}
		for n, v := range w.sub.ReturnedResources() {
			if it := ts.served.get(n); it != nil && it.version == v {
				was[n] = ts.acked.get(n)
				ts.acked.set(n, it)
				ts.sentView.set(n, it)
			}
		}
		s.heldChangedLocked(ts, was)
	}
	changed, gone := comparedToSent(ts, items)
	if !changed && !gone {
		return // nothing new: the watch stays open
	}
	resp := &discovery.DeltaDiscoveryResponse{TypeUrl: ts.typeURL, SystemVersionInfo: ts.served.version}
	f := &flight{delta: resp, undo: map[string]*item{}}
	if ts.sentView.len() == 0 {
		if sv := ts.served; len(items) > 0 && sv.holdsAll(items) {
			// Everything a shared served holds, to a client that holds nothing: the response
			// every such stream gets, with the served's own slices (the codec's shared encoding).
			resp.Resources, f.items, f.whole = sv.wires, sv.sorted, sv // wires is set with anys
			if len(ts.forced) > 0 {
				for _, it := range items {
					sentForced(ts, it.name)
				}
			}
			ts.sentView.holdServed(sv)
			s.queueDeltaLocked(ts, w, f)
			return
		}
		ts.sentView.own(len(items)) // the first response: grown once, not by doubling
	}
	for _, it := range items {
		cur := ts.sentView.get(it.name)
		if cur != nil && cur.version == it.version && !ts.forced[it.name] {
			continue
		}
		sentForced(ts, it.name)
		resp.Resources = append(resp.Resources, it.resource())
		f.items = append(f.items, it)
		if cur != nil {
			f.undo[it.name] = cur
		}
		ts.sentView.set(it.name, it)
	}
	if gone { // a name sent is not in the view: removed, or no longer asked for
		for n, cur := range ts.sentNotIn(items) {
			if s.subscribedLocked(ts, n) {
				resp.RemovedResources = append(resp.RemovedResources, n)
				f.removed = append(f.removed, n)
				f.undo[n] = cur
			}
			ts.sentView.set(n, nil) // unsubscribed: the client forgot it, nothing to tell
		}
	}
	ts.sentView.settle(ts.served)
	if len(resp.Resources)+len(resp.RemovedResources) == 0 {
		return // nothing new: the watch stays open
	}
	slices.Sort(resp.RemovedResources)
	slices.SortFunc(resp.Resources, func(a, b *discovery.Resource) int { return strings.Compare(a.Name, b.Name) })
	s.queueDeltaLocked(ts, w, f)
}

// queueDeltaLocked queues f's response to the delta watch w. Call with s.mu.
func (s *session) queueDeltaLocked(ts *typeState, w *watch, f *flight) {
	resp := f.delta
	s.addFlightLocked(ts, f)
	ts.w = nil
	// The delta server keeps NextVersionMap as the stream's returned resources, and edits it when
	// the client unsubscribes: it must be the stream's own. The guard reads them once, when a
	// stream starts (initial_resource_versions, above); after that what the client was sent is
	// the sent view. So the server is given an empty map, not a copy of the sent view a response.
	s.outq = append(s.outq, queued{w: w, ts: ts, f: f, delta: &cache.DeltaPassthroughResponse{
		DeltaRequest: w.deltaReq, DeltaDiscoveryResponse: resp, NextVersionMap: map[string]string{}}})
}

// comparedToSent compares items (a view) with what the client was sent: whether one is new, at
// another version or forced (changed), and whether a name sent is not in the view (gone).
func comparedToSent(ts *typeState, items []*item) (changed, gone bool) {
	sent := 0
	for _, it := range items {
		cur := ts.sentView.get(it.name)
		if cur != nil {
			sent++
		}
		if cur == nil || cur.version != it.version || ts.forced[it.name] {
			changed = true
		}
	}
	return changed, sent < ts.sentView.len()
}

// keptLocked records that the client keeps what it held of name (it refused what it was sent).
func (s *session) keptLocked(ts *typeState, name string) {
	ts.sentView.set(name, ts.acked.get(name))
}

// sentNotIn is what the sent view holds of names not in items (sorted by name), by name.
func (ts *typeState) sentNotIn(items []*item) map[string]*item {
	out := map[string]*item{}
	for n, it := range ts.sentView.all() {
		if _, in := slices.BinarySearchFunc(items, n, itemNamed); !in {
			out[n] = it
		}
	}
	return out
}

// unsentLocked undoes the responses made for w that the server will never send (its watch was
// canceled before they were handed over): the next watch is answered as if they were not made.
func (s *session) unsentLocked(ts *typeState, w *watch) {
	s.outq = slices.DeleteFunc(s.outq, func(q queued) bool {
		if q.w != w {
			return false
		}
		s.undoLocked(q.ts, q.f)
		return true
	})
}

// undoLocked undoes a response that was not sent.
func (s *session) undoLocked(ts *typeState, f *flight) {
	if ts == nil || f == nil {
		return
	}
	ts.flight = slices.DeleteFunc(ts.flight, func(x *flight) bool { return x == f })
	ts.made = false // the view made was not sent
	if !s.delta {
		ts.lastView = nil // the next watch gets the view, whatever it is
		return
	}
	for _, it := range f.items {
		ts.sentView.set(it.name, nil) // what it had of them, if anything, is in undo
	}
	for n, was := range f.undo {
		ts.sentView.set(n, was)
	}
}

// deltaSent records a delta response the server sends.
func (s *session) deltaSent(resp *discovery.DeltaDiscoveryResponse) {
	s.sent(resp.GetTypeUrl(), resp.GetNonce(), func(f *flight) bool { return f.delta == resp })
}
