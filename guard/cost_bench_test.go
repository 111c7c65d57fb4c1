package guard

import (
	"fmt"
	"maps"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
)

// What the guard's engine costs a client with many names, measured on one session without a
// server: go test ./guard -run '^$' -bench 'Cost' -benchmem -benchtime 1x.

// holdingSession is a session whose client holds n EDS clusters (c0000...), asked for by name
// as grpc-go asks, and their n load assignments, of which the cache no longer serves the first
// removed clusters: what the client holds of them stays while it asks (a held removal).
func holdingSession(b testing.TB, n, removed int) (*session, *typeState) {
	gd, err := New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(gd.Close)
	s := newSession(gd, 1, false)
	s.mu.Lock()
	defer s.mu.Unlock()
	clusters, endpoints := s.typeOf(resource.ClusterType), s.typeOf(resource.EndpointType)
	var cs, es, kept []*item
	var names []string
	for i := range n {
		name := fmt.Sprintf("c%05d", i)
		names = append(names, name)
		c := &item{name: name, version: "1", refs: []Ref{{TypeURL: resource.EndpointType, Name: name}}}
		cs, es = append(cs, c), append(es, &item{name: name, version: "1"})
		if i >= removed {
			kept = append(kept, c)
		}
	}
	clusters.sub = stream.NewSotwSubscription(names, true)
	endpoints.sub = stream.NewSotwSubscription(names, true)
	clusters.served = (*served)(nil).fold(resource.ClusterType, kept, "2", nil, true)
	endpoints.served = (*served)(nil).fold(resource.EndpointType, es, "1", nil, true)
	s.acceptLocked(clusters, cs, nil, nil)
	s.acceptLocked(endpoints, es, nil, nil)
	clusters.w = &watch{sub: clusters.sub}
	return s, clusters
}

// The view of a type with held removals: each removed name asks what the client holds that
// references it.
func BenchmarkCostOfHeldRemovals(b *testing.B) {
	for _, c := range []struct{ n, removed int }{{1000, 100}, {10000, 1000}} {
		b.Run(fmt.Sprintf("names=%d/removed=%d", c.n, c.removed), func(b *testing.B) {
			s, ts := holdingSession(b, c.n, c.removed)
			var buf []*item
			b.ReportAllocs()
			for b.Loop() {
				s.mu.Lock()
				buf, _ = s.viewLocked(ts, buf[:0])
				s.mu.Unlock()
			}
			if len(buf) != c.n {
				b.Fatalf("the view holds %d names, want %d", len(buf), c.n)
			}
		})
	}
}

// ackingClient is a session whose client asks for n EDS clusters (every one) and their n load
// assignments (by name), and answers every response the session makes at once.
type ackingClient struct {
	s       *session
	node    *core.Node
	delta   bool
	watches map[string]*watch
	nonce   int
}

func newAckingClient(b testing.TB, delta bool, n int) *ackingClient {
	gd, err := New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(gd.Close)
	id := int64(1)
	if delta {
		id = -1
	}
	c := &ackingClient{s: newSession(gd, id, delta), node: &core.Node{Id: "client"}, delta: delta, watches: map[string]*watch{}}
	var cs, es []*item
	var names []string
	for i := range n {
		name := fmt.Sprintf("c%05d", i)
		names = append(names, name)
		cs = append(cs, &item{name: name, version: "1", refs: []Ref{{TypeURL: resource.EndpointType, Name: name}}})
		es = append(es, &item{name: name, version: "1"})
	}
	c.s.mu.Lock()
	c.s.typeOf(resource.ClusterType).served = (*served)(nil).fold(resource.ClusterType, cs, "1", nil, true)
	c.s.typeOf(resource.EndpointType).served = (*served)(nil).fold(resource.EndpointType, es, "1", map[string]string{}, true)
	c.s.mu.Unlock()
	if delta {
		c.watch(resource.ClusterType, stream.NewDeltaSubscription(nil, nil, nil, true))
		c.watch(resource.EndpointType, stream.NewDeltaSubscription(names, nil, nil, false))
	} else {
		c.watch(resource.ClusterType, stream.NewSotwSubscription(nil, true))
		c.watch(resource.EndpointType, stream.NewSotwSubscription(names, true))
	}
	c.answer()
	return c
}

// watch opens the server's watch of typeURL with sub, as the server does after each request.
func (c *ackingClient) watch(typeURL string, sub stream.Subscription) {
	w := &watch{sub: &sub}
	if c.delta {
		w.deltaReq, w.deltaOut = &discovery.DeltaDiscoveryRequest{TypeUrl: typeURL}, make(chan cache.DeltaResponse, 1)
	} else {
		w.req, w.out = &discovery.DiscoveryRequest{TypeUrl: typeURL}, make(chan cache.Response, 1)
	}
	c.watches[typeURL] = w
	if _, err := c.s.watch(w, typeURL, c.node); err != nil {
		panic(err)
	}
}

// answer sends every response the session made and ACKs each, until it makes none; it
// returns how many it ACKed.
func (c *ackingClient) answer() int {
	acked := 0
	for {
		c.s.mu.Lock()
		q := c.s.outq
		c.s.outq = nil
		c.s.mu.Unlock()
		if len(q) == 0 {
			return acked
		}
		for _, x := range q {
			c.nonce++
			nonce := fmt.Sprint(c.nonce)
			typeURL := x.ts.typeURL
			c.s.sent(typeURL, nonce, func(f *flight) bool { return f == x.f })
			c.ack(typeURL, nonce)
			acked++
		}
	}
}

// ack is the client's ACK of the response with nonce: the request, the session's review and the
// new watch.
func (c *ackingClient) ack(typeURL, nonce string) {
	c.s.request(c.node, typeURL, nonce, nil, false)
	c.s.reviewIfAsked()
	w := c.watches[typeURL]
	c.watch(typeURL, *w.sub.(*stream.Subscription))
}

// update makes the cache serve a new version of load assignment i: the session makes a response
// of it.
func (c *ackingClient) update(i, version int) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.types[resource.EndpointType]
	name := fmt.Sprintf("c%05d", i)
	it := &item{name: name, version: fmt.Sprint(version)}
	returned := maps.Clone(ts.served.returned)
	returned[name] = it.version
	ts.served = ts.served.fold(resource.EndpointType, []*item{it}, fmt.Sprint(version), returned, true)
	s.evaluateLocked(ts)
}

// An ACK of a response that brought one load assignment, to a client that holds n clusters and
// their n load assignments: what the session does with it (the request, its review, the next
// watch), the update and its response left out.
func BenchmarkCostOfAnACK(b *testing.B) {
	for _, delta := range []bool{false, true} {
		for _, n := range []int{1000, 10000} {
			b.Run(fmt.Sprintf("%s/names=%d", map[bool]string{false: "sotw", true: "delta"}[delta], n), func(b *testing.B) {
				c := newAckingClient(b, delta, n)
				b.ReportAllocs()
				version := 1
				for b.Loop() {
					b.StopTimer()
					version++
					c.update(version%n, version)
					b.StartTimer()
					if c.answer() != 1 {
						b.Fatal("want one response, of the update")
					}
				}
			})
		}
	}
}
