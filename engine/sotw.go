package engine

// The state-of-the-world protocol: go-control-plane's SotW server drives a Session as its delta
// server does; a SotW response is recorded as the delta it makes.

import (
	"context"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/engine/nack"
)

// sotwID is the Cache's id of a SotW stream: negated, apart from go-control-plane's delta ids.
func sotwID(id int64) int64 { return -id }

// OnStreamOpen implements sotw.Callbacks.
func (t *Tracker) OnStreamOpen(ctx context.Context, id int64, _ string) error {
	t.cache.openSession(sotwID(id), streamInfoOf(ctx), true)
	return nil
}

// OnStreamClosed implements sotw.Callbacks.
func (t *Tracker) OnStreamClosed(id int64, node *core.Node) { t.OnDeltaStreamClosed(sotwID(id), node) }

// OnStreamRequest implements sotw.Callbacks: it runs on the stream's goroutine before the server
// creates the request's watch.
func (t *Tracker) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	s := t.cache.Session(sotwID(id))
	if s == nil {
		return status.Error(codes.Internal, "stream not open")
	}
	r, err := t.handle(s, sotwID(id), incoming{
		node: req.GetNode().GetId(), typeURL: req.GetTypeUrl(), nonce: req.GetResponseNonce(), detail: req.GetErrorDetail(), sotw: req,
	})
	t.tell(&r)
	return err
}

// OnStreamResponse implements sotw.Callbacks: it records the nonce of a response in flight.
func (t *Tracker) OnStreamResponse(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	s := t.cache.Session(sotwID(id))
	if s == nil {
		return
	}
	s.mu.Lock()
	var r *inflight
	if i := slices.IndexFunc(s.inflight, func(f *inflight) bool { return f.sotw == resp && f.nonce == "" }); i >= 0 {
		r = s.inflight[i]
		r.countSent(resp.GetNonce())
	}
	node := s.node
	s.mu.Unlock()
	if r != nil {
		t.observers.Sent(sentOf(sotwID(id), node, r))
	}
}

// OnFetchRequest implements rest.Callbacks: the cache serves streams only.
func (t *Tracker) OnFetchRequest(context.Context, *discovery.DiscoveryRequest) error {
	return status.Error(codes.Unimplemented, "this server serves xDS over ADS streams (SotW or delta), not REST fetches")
}

// OnFetchResponse implements rest.Callbacks.
func (t *Tracker) OnFetchResponse(*discovery.DiscoveryRequest, *discovery.DiscoveryResponse) {}

// boundSotw checks a SotW request before anything of it is stored: its type URL must be one the
// cache serves, and its names the snapshot does not hold must stay within MaxUnknownNames.
func (t *Tracker) boundSotw(s *Session, req *discovery.DiscoveryRequest) error {
	switch typeURL := req.GetTypeUrl(); {
	case typeURL == "":
		return status.Error(codes.InvalidArgument, "type_url is required: one type per request, as ADS has it")
	case !t.cache.serves(typeURL):
		return status.Errorf(codes.InvalidArgument, "type_url %q is not a type this server serves (it serves %s)",
			nack.Truncate(typeURL, 128), nack.Truncate(strings.Join(t.cache.kinds, ", "), 512))
	}
	return s.admitSotwNames(req.GetTypeUrl(), req.GetResourceNames(), t.limits.MaxUnknownNames)
}

// admitSotwNames records the names of typeURL a SotW request asks for that the snapshot does not
// hold, or refuses the request, changing nothing, when the stream would then ask for over max.
func (s *Session) admitSotwNames(typeURL string, names []string, max int) error {
	entries := s.snapshot().Type(typeURL)
	s.mu.Lock()
	defer s.mu.Unlock()
	total := 0
	for t, ns := range s.unknown {
		if t != typeURL {
			total += len(ns)
		}
	}
	var unknown map[string]struct{} // made for the first name not held: most requests have none
	for _, n := range names {
		if _, ok := entries[n]; ok || n == "*" {
			continue
		}
		if unknown == nil {
			unknown = map[string]struct{}{}
		}
		unknown[n] = struct{}{}
		if total+len(unknown) > max {
			return status.Errorf(codes.ResourceExhausted, "this stream would ask for more than %d names the server does not hold (kds-host: --kds-max-unknown-names)", max)
		}
	}
	switch {
	case len(unknown) == 0:
		delete(s.unknown, typeURL)
	case s.unknown == nil:
		s.unknown = map[string]map[string]struct{}{typeURL: unknown}
	default:
		s.unknown[typeURL] = unknown
	}
	return nil
}

// bindSotw tells the cache which session a SotW request belongs to, for CreateWatch.
func (c *Cache) bindSotw(st *Session, req *discovery.DiscoveryRequest) {
	c.mu.Lock()
	c.sotwRequests[req] = st
	c.mu.Unlock()
}

// CreateWatch implements cache.ConfigWatcher for go-control-plane's SotW server. It never blocks:
// a response that is ready is queued for the stream's sender.
func (c *Cache) CreateWatch(req *cache.Request, sub cache.Subscription, out chan cache.Response) (func(), error) {
	st, err := takeBound(c, c.sotwRequests, req)
	if err != nil {
		return nil, err
	}
	w := &watch{kind: req.GetTypeUrl(), sotwReq: req, sub: sub, sotwOut: out, canceled: make(chan struct{}), finished: make(chan struct{})}
	st.mu.Lock()
	ks := st.kind(w.kind)
	w.ks = ks
	if key := subscriptionKey(sub); ks.sotwSeq == 0 || key != ks.sotwSub {
		// A changed subscription: the client drops the names no longer asked for; every name is looked at.
		ks.full, ks.sotwWhole = true, true
		var gone []string
		ks.delivered.each(func(n string, _ *discovery.Resource) {
			if !w.subscribes(n) {
				gone = append(gone, n)
			}
		})
		for _, n := range gone {
			st.setView(w.kind, n, func() { ks.dropDelivered(n); delete(ks.refused, n) })
		}
	}
	c.watchLocked(st, ks, w)
	st.mu.Unlock()
	return func() { c.cancel(st, w) }, nil
}

// takeBound takes the session a request was bound to (bindRequest, bindSotw); a request the
// callbacks never saw is an error, told to OnUnbound's function.
func takeBound[R comparable](c *Cache, bound map[R]*Session, req R) (*Session, error) {
	c.mu.Lock()
	st, ok := bound[req]
	delete(bound, req)
	c.mu.Unlock()
	if ok {
		return st, nil
	}
	err := status.Error(codes.FailedPrecondition, "the request was not seen by the cache's callbacks: the server must be made with them (server.NewServer(ctx, cache, callbacks), the callbacks composed with yours)")
	if f := c.onUnbound.Load(); f != nil {
		(*f)(err)
	}
	return nil, err
}

// OnUnbound sets what hears of a watch asked for a request the callbacks never saw: a server
// made without them (its client gets FailedPrecondition).
func (c *Cache) OnUnbound(f func(error)) { c.onUnbound.Store(&f) }

// Fetch implements cache.ConfigFetcher: the cache serves streams only.
func (c *Cache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, status.Error(codes.Unimplemented, "this server serves xDS over ADS streams (SotW or delta), not REST fetches")
}

// subscriptionKey identifies a SotW subscription: wildcard, or an order-independent digest of its names.
func subscriptionKey(sub cache.Subscription) subKey {
	if sub.IsWildcard() {
		return subKey{all: true}
	}
	var k subKey
	for n := range sub.SubscribedResources() {
		k.sum ^= maphash.String(digestSeed, n)
		k.n++
	}
	return k
}

// subKey is a subscriptionKey: two different subscriptions have equal keys but for a 2^-64 chance.
type subKey struct {
	all bool
	sum uint64
	n   int
}

// answerSotwLocked answers w with the delta evaluation's response (all: snap's whole type) as a
// full state, or what it sends new; one that would only remove is not sent, and the session
// forgets the names. It reports whether it answered. Call with st.mu.
func (c *Cache) answerSotwLocked(st *Session, ks *kindState, w *watch, snap *Snapshot, resources []*discovery.Resource, removed []string, all bool) bool {
	key := subscriptionKey(w.sub)
	// Listeners and Clusters are sent whole, a name left out removed (as the xDS protocol has it).
	full := w.kind == resourcev3.ListenerType || w.kind == resourcev3.ClusterType || ks.sotwSeq == 0 || key != ks.sotwSub || ks.sotwWhole
	if !full && len(resources) == 0 {
		for _, n := range removed {
			st.setView(w.kind, n, func() { ks.dropDelivered(n); delete(ks.refused, n) })
		}
		return false
	}
	var anys []*anypb.Any
	var again []namedVersion
	var againAll map[string]*Entry
	switch {
	case all:
		anys = snap.order(w.kind).anys // every stream's, shared
	case full && len(ks.refused) == 0 && ks.delivered.advances(snap, w.kind, resources, removed):
		// A stream in step: it holds the snapshot's type once it takes them.
		anys, againAll = snap.order(w.kind).anys, snap.Type(w.kind)
	case full:
		anys, again = holdsAfter(ks, snap.Type(w.kind), resources, removed)
		if ko := snap.order(w.kind); slices.Equal(anys, ko.anys) {
			anys = ko.anys // the snapshot's list, which the codec writes from one encoding
		}
	default:
		anys = make([]*anypb.Any, len(resources))
		for i, r := range resources {
			anys[i] = r.GetResource()
		}
	}
	ks.sotwSeq++
	ks.sotwSub, ks.sotwWhole = key, false
	if !full {
		removed = nil // the client keeps them
	}
	w.answered = true
	w.answer.pass = cache.DeltaPassthroughResponse{DeltaDiscoveryResponse: &discovery.DeltaDiscoveryResponse{
		TypeUrl: w.kind, SystemVersionInfo: c.versionInfo(), Resources: resources, RemovedResources: removed}}
	w.resp = &w.answer.pass
	w.sotwResp = sotwResponse{req: w.sotwReq, again: again, againAll: againAll, resp: &discovery.DiscoveryResponse{
		VersionInfo: fmt.Sprintf("%s.%d", c.versionInfo(), ks.sotwSeq), TypeUrl: w.kind, Resources: anys}}
	return true
}

// holdsAfter is what the client of ks holds once it takes resources and removed: the Anys in
// name order (for a name it refused, what it holds instead), and the names and versions beyond
// resources (again). A refusal on its way is not known yet (nackOf).
func holdsAfter(ks *kindState, served map[string]*Entry, resources []*discovery.Resource, removed []string) ([]*anypb.Any, []namedVersion) {
	type held struct {
		any     *anypb.Any
		version string
		sent    bool // one of resources
	}
	if ks.delivered.len() == 0 && len(ks.refused) == 0 && len(removed) == 0 && slices.IsSortedFunc(resources, byName) {
		out := make([]*anypb.Any, len(resources)) // it holds nothing yet: what it is sent, in order (most often a stream's first)
		for i, r := range resources {
			out[i] = r.GetResource()
		}
		return out, nil
	}
	byName := make(map[string]held, ks.delivered.len()+len(resources))
	ks.delivered.each(func(n string, r *discovery.Resource) {
		if a := r.GetResource(); a != nil {
			byName[n] = held{any: a, version: r.Version}
		}
	})
	for n, h := range ks.refused {
		switch e := served[n]; {
		case !h.ok:
			delete(byName, n)
		case e != nil && e.Version == h.version:
			byName[n] = held{any: e.Any, version: e.Version}
		}
	}
	for _, r := range resources {
		byName[r.GetName()] = held{any: r.GetResource(), version: r.GetVersion(), sent: true}
	}
	for _, n := range removed {
		delete(byName, n)
	}
	names := slices.AppendSeq(make([]string, 0, len(byName)), maps.Keys(byName))
	slices.Sort(names)
	out := make([]*anypb.Any, len(names))
	var again []namedVersion
	for i, n := range names {
		h := byName[n]
		out[i] = h.any
		if !h.sent {
			again = append(again, namedVersion{n, h.version})
		}
	}
	return out, again
}

// sotwResponse is a SotW response the cache made, sent as it is; again (or againAll) is what a
// full state carries beyond its delta (holdsAfter).
type sotwResponse struct {
	req      *discovery.DiscoveryRequest
	resp     *discovery.DiscoveryResponse
	again    []namedVersion
	againAll map[string]*Entry // instead of again: the full state is these entries, again those not in the delta
}

func (r *sotwResponse) GetDiscoveryResponse() (*discovery.DiscoveryResponse, error) {
	return r.resp, nil
}
func (r *sotwResponse) GetRequest() *discovery.DiscoveryRequest { return r.req }
func (r *sotwResponse) GetVersion() (string, error)             { return r.resp.GetVersionInfo(), nil }
func (r *sotwResponse) GetResponseVersion() string              { return r.resp.GetVersionInfo() }
func (r *sotwResponse) GetReturnedResources() map[string]string { return nil }
func (r *sotwResponse) GetContext() context.Context             { return context.Background() }
