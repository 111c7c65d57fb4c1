package guard

// The delta server's side of a session: a response carries what differs from what the client
// was sent and keeps (sentView), made from the same view as a state-of-the-world response.

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

// respondDeltaLocked answers the delta watch w with what items (the view) changes of what the
// client was sent, if anything. Call with s.mu.
func (s *session) respondDeltaLocked(ts *typeState, w *watch, items []*item) {
	if !ts.seeded {
		// What the client says it holds (initial_resource_versions, on a new stream): it has
		// those, where they are the versions served.
		ts.seeded = true
		for n, v := range w.sub.ReturnedResources() {
			if it := ts.served.get(n); it != nil && it.version == v {
				ts.sentView[n], ts.acked[n] = it, it
			}
		}
	}
	resp := &discovery.DeltaDiscoveryResponse{TypeUrl: ts.typeURL, SystemVersionInfo: ts.served.version}
	f := &flight{delta: resp, undo: map[string]*item{}}
	in := make(map[string]bool, len(items))
	for _, it := range items {
		in[it.name] = true
		cur := ts.sentView[it.name]
		if cur != nil && cur.version == it.version && !ts.forced[it.name] {
			continue
		}
		delete(ts.forced, it.name)
		resp.Resources = append(resp.Resources, &discovery.Resource{Name: it.name, Version: it.version, Resource: it.any})
		f.items = append(f.items, it)
		f.undo[it.name] = cur
		ts.sentView[it.name] = it
	}
	for n, cur := range ts.sentView {
		if in[n] {
			continue
		}
		if s.subscribedLocked(ts, n) {
			resp.RemovedResources = append(resp.RemovedResources, n)
			f.removed = append(f.removed, n)
			f.undo[n] = cur
		}
		delete(ts.sentView, n) // unsubscribed: the client forgot it, nothing to tell
	}
	if len(resp.Resources)+len(resp.RemovedResources) == 0 {
		return // nothing new: the watch stays open
	}
	slices.Sort(resp.RemovedResources)
	slices.SortFunc(resp.Resources, func(a, b *discovery.Resource) int { return strings.Compare(a.Name, b.Name) })
	next := make(map[string]string, len(ts.sentView))
	for n, it := range ts.sentView {
		next[n] = it.version
	}
	s.addFlightLocked(ts, f)
	ts.w = nil
	s.outq = append(s.outq, queued{w: w, ts: ts, f: f, delta: &cache.DeltaPassthroughResponse{
		DeltaRequest: w.deltaReq, DeltaDiscoveryResponse: resp, NextVersionMap: next}})
}

// keptLocked records that the client keeps what it held of name (it refused what it was sent).
func (s *session) keptLocked(ts *typeState, name string) {
	if a := ts.acked[name]; a != nil {
		ts.sentView[name] = a
	} else {
		delete(ts.sentView, name)
	}
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
	if !s.delta {
		ts.lastView = nil // the next watch gets the view, whatever it is
		return
	}
	for n, was := range f.undo {
		if was == nil {
			delete(ts.sentView, n)
		} else {
			ts.sentView[n] = was
		}
	}
}

// deltaSent records a delta response the server sends.
func (s *session) deltaSent(resp *discovery.DeltaDiscoveryResponse) {
	s.sent(resp.GetTypeUrl(), resp.GetNonce(), func(f *flight) bool { return f.delta == resp })
}
