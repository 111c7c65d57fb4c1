package guard

import (
	"fmt"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
)

// What the guard's engine costs a client with many names, measured on one session without a
// server: go test ./guard -run '^$' -bench 'Cost' -benchmem -benchtime 1x.

// holdingSession is a session whose client holds n EDS clusters (c0000...), asked for by name
// as grpc-go asks, and their n load assignments, of which the cache no longer serves the first
// removed clusters: what the client holds of them stays while it asks (a held removal).
func holdingSession(b *testing.B, n, removed int) (*session, *typeState) {
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
