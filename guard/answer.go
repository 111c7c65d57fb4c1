package guard

// A client's answers: what a response brought, and what an ACK or NACK of it says the client holds.

import (
	"context"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/nack"
)

// sent records that the server sends resp (with its nonce), and tells the retry scheduler what
// it brings new.
func (s *session) sent(typeURL, nonce string, is func(*flight) bool) {
	s.mu.Lock()
	ts := s.types[typeURL]
	var f *flight
	if ts != nil {
		for _, x := range ts.flight {
			if is(x) {
				f = x
			}
		}
	}
	if f == nil {
		s.mu.Unlock()
		return
	}
	f.nonce = nonce
	ins := s.insight[ts.typeURL]
	ins.Responses++
	s.g.totals.add(&s.g.totals.responses, ts.typeURL)
	fresh := newVersions(ts, f.items)
	zone, opened := s.node, s.opened
	s.mu.Unlock()
	if opened {
		s.g.obs.Sent(event.Sent{StreamID: s.id, Node: zone, TypeURL: ts.typeURL, Versions: fresh.versions()})
	}
}

// freshItems are items at a version the client has not accepted, sorted by name.
type freshItems []*item

// newVersions are the items at a version the client has not accepted.
func newVersions(ts *typeState, items []*item) freshItems {
	var fresh freshItems // nil while every item so far is new: then it is items itself
	for i, it := range items {
		if a := ts.acked.get(it.name); a == nil || a.version != it.version {
			if fresh != nil {
				fresh = append(fresh, it)
			}
		} else if fresh == nil {
			fresh = append(make(freshItems, 0, len(items)-1), items[:i]...)
		}
	}
	if fresh == nil {
		fresh = items // read only, as a flight's items are
	}
	if !slices.IsSortedFunc(fresh, byItemName) { // a view's are
		fresh = slices.Clone(fresh)
		slices.SortFunc(fresh, byItemName)
	}
	return fresh
}

// get is the version of name, if it is one of them.
func (f freshItems) get(name string) (string, bool) {
	if i, ok := slices.BinarySearchFunc(f, name, itemNamed); ok {
		return f[i].version, true
	}
	return "", false
}

// versions is the view of them that events carry.
func (f freshItems) versions() event.Versions {
	return event.VersionsFunc(len(f), func(yield func(string, string) bool) {
		for _, it := range f {
			if !yield(it.name, it.version) {
				return
			}
		}
	}, f.get)
}

// request applies what a client's request says of the last response of its type: an ACK, or a
// NACK and what it refused; asks says a delta request changes what the client asks for.
func (s *session) request(node *core.Node, typeURL, nonce string, detail *rpcstatus.Status, asks bool) {
	s.mu.Lock()
	if s.node == "" {
		s.node = node.GetId()
	}
	open := !s.opened
	s.opened = true
	zone := s.node
	var ack *event.ACK
	var nack *event.NACK
	ts := s.types[typeURL]
	if ts != nil && asks {
		ts.asked = true // the type's next watch looks at every name (subChangedLocked)
	}
	if ts != nil && nonce != "" {
		for i, f := range ts.flight {
			if f.nonce != nonce {
				continue
			}
			ts.flight = ts.flight[i+1:]
			ack, nack = s.answerLocked(ts, f, detail)
			break
		}
	}
	s.mu.Unlock()
	if open {
		s.g.obs.StreamOpened(s.id, zone)
	}
	if ack != nil {
		s.g.obs.ACK(*ack)
	}
	if nack != nil {
		s.g.obs.NACK(*nack)
		s.g.log.Debug("client refused resources", "client", zone, "type", nack.TypeURL, "refused", len(nack.Rejected), "detail", nack.Detail)
	}
	if ack != nil || nack != nil {
		// What the client holds changed: what waited for it may go now. The session's
		// goroutine looks, not the xDS callback.
		s.mu.Lock()
		s.review = true
		s.mu.Unlock()
		s.poke()
	}
}

// answerLocked applies the client's answer to response f, and returns the event for the retry
// scheduler. Call with s.mu.
func (s *session) answerLocked(ts *typeState, f *flight, detail *rpcstatus.Status) (*event.ACK, *event.NACK) {
	ins := s.insight[ts.typeURL]
	fresh := newVersions(ts, f.items)
	defer s.heldChangedLocked(ts, s.answeredLocked(ts, f)) // what it held before the answer, read now
	if detail == nil {
		ins.ACKs++
		ins.LastError = ""
		s.acceptLocked(ts, f.items, nil, f.whole)
		for _, n := range f.removed {
			ts.acked.set(n, nil)
		}
		ts.acked.settle(ts.served)
		s.ownerArrivedLocked()
		return &event.ACK{StreamID: s.id, Node: s.node, TypeURL: ts.typeURL, Versions: fresh.versions(), Removed: f.removed}, nil
	}
	ins.NACKs++
	s.g.totals.add(&s.g.totals.nacks, ts.typeURL)
	carried := make([]nack.Carried, len(f.items))
	for i, it := range f.items {
		_, isNew := fresh.get(it.name)
		carried[i] = nack.Carried{Name: it.name, Version: it.version, New: isNew}
	}
	// A plain client's NACK is about content (neither Envoy nor grpc-go has a transient cause).
	rejected, msg := nack.Read(detail, carried, maxLastError, event.CauseInvalid)
	ins.LastError = msg
	nk := &event.NACK{StreamID: s.id, Node: s.node, TypeURL: ts.typeURL, Detail: msg, Accepted: map[string]string{}, Rejected: rejected}
	isRefused := make(map[string]bool, len(rejected))
	refused := make([]string, 0, len(rejected))
	for _, rj := range rejected {
		isRefused[rj.Name] = true
		refused = append(refused, rj.Name)
		ts.refused[rj.Name] = refusal{version: rj.Version, reason: rj.Reason}
	}
	var accepted []*item
	for _, it := range f.items {
		if isRefused[it.name] {
			continue
		}
		accepted = append(accepted, it)
		if v, ok := fresh.get(it.name); ok {
			nk.Accepted[it.name] = v
		}
	}
	// grpc-go and Envoy take the valid resources of a response they NACK.
	s.acceptLocked(ts, accepted, refused, nil)
	s.ownerArrivedLocked()
	if s.delta {
		for _, n := range refused {
			s.keptLocked(ts, n) // the client keeps what it had: the next response is made against that
		}
		for _, n := range f.removed {
			if !isRefused[n] {
				ts.acked.set(n, nil)
			}
		}
	}
	ts.acked.settle(ts.served)
	return nil, nk
}

// answeredLocked is what the client holds of the names an answer to f may change, before it:
// f's names, and, of a type whose response is the client's whole state, every name it holds.
// Call with s.mu.
func (s *session) answeredLocked(ts *typeState, f *flight) map[string]*item {
	was := make(map[string]*item, len(f.items)+len(f.removed))
	for _, it := range f.items {
		was[it.name] = ts.acked.get(it.name)
	}
	for _, n := range f.removed {
		was[n] = ts.acked.get(n)
	}
	if s.fullStateLocked(ts.typeURL) {
		for n, a := range ts.acked.all() {
			was[n] = a
		}
	}
	return was
}

// acceptLocked records that the client holds items now, whole if they are everything a shared
// served holds. Of a type whose response is the client's whole state (fullState), it holds
// nothing else, but for the names it refused in the same answer (kept: it keeps the version it
// had). Call with s.mu.
func (s *session) acceptLocked(ts *typeState, items []*item, kept []string, whole *served) {
	full := s.fullStateLocked(ts.typeURL)
	switch {
	case whole != nil && len(kept) == 0 && (full || ts.acked.holdsWithin(whole)):
		ts.acked.holdServed(whole) // everything whole holds, and nothing else
	default:
		if full {
			was := ts.acked
			ts.acked.own(len(items) + len(kept))
			for _, n := range kept {
				if it := was.get(n); it != nil {
					ts.acked.set(n, it)
				}
			}
		} else if ts.acked.len() == 0 {
			ts.acked.own(len(items)) // the first answer: grown once, not by doubling
		}
		for _, it := range items {
			ts.acked.set(it.name, it)
		}
	}
	for _, it := range items {
		if r, ok := ts.refused[it.name]; ok && r.version == it.version {
			delete(ts.refused, it.name)
		}
	}
}

// fullState reports whether a SotW response of the type is the client's whole state of it
// (Listeners, Clusters): a name left out is removed.
func (s *session) fullStateLocked(typeURL string) bool {
	return !s.delta && fullState(typeURL)
}

func fullState(typeURL string) bool {
	return typeURL == resource.ListenerType || typeURL == resource.ClusterType
}

// response is a response the guard made: the server sends it as is.
type response struct {
	req  *discovery.DiscoveryRequest
	resp *discovery.DiscoveryResponse
}

func (r *response) GetDiscoveryResponse() (*discovery.DiscoveryResponse, error) { return r.resp, nil }
func (r *response) GetRequest() *discovery.DiscoveryRequest                     { return r.req }
func (r *response) GetVersion() (string, error)                                 { return r.resp.GetVersionInfo(), nil }
func (r *response) GetResponseVersion() string                                  { return r.resp.GetVersionInfo() }
func (r *response) GetReturnedResources() map[string]string                     { return nil }
func (r *response) GetContext() context.Context                                 { return context.Background() }
