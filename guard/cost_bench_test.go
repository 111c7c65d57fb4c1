package guard_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	. "github.com/onsi/gomega"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"

	"github.com/kds-host/kds-host/guard"
)

// What a client with many names costs the guard's engine, measured on one stream driven through
// the guard's callbacks and watches, without gRPC: go test ./guard -run '^$' -bench 'Cost'
// -benchmem -benchtime 1x.

// ackingClient is a client of the guard over a SnapshotCache that asks for n EDS clusters (every
// one) and their n load assignments (by name), and ACKs what it is sent.
type ackingClient struct {
	tb    testing.TB
	snaps cache.SnapshotCache
	g     *guard.Guard
	cb    server.Callbacks
	delta bool
	n     int
	names []string
	nonce int
	sotw  map[string]chan cache.Response
	dout  map[string]chan cache.DeltaResponse
	subs  map[string]*stream.Subscription
}

var costNode = &core.Node{Id: "client"}

func newAckingClient(tb testing.TB, delta bool, n int) *ackingClient {
	snaps := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	g, err := guard.New(snaps, guard.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(g.Close)
	c := &ackingClient{tb: tb, snaps: snaps, g: g, cb: g.Callbacks(nil), delta: delta, n: n,
		sotw: map[string]chan cache.Response{}, dout: map[string]chan cache.DeltaResponse{}, subs: map[string]*stream.Subscription{}}
	for i := range n {
		c.names = append(c.names, fmt.Sprintf("c%05d", i))
	}
	c.set(1, 1)
	if delta {
		if err := c.cb.OnDeltaStreamOpen(context.Background(), 1, ""); err != nil {
			tb.Fatal(err)
		}
	} else if err := c.cb.OnStreamOpen(context.Background(), 1, ""); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if delta {
			c.cb.OnDeltaStreamClosed(1, costNode)
		} else {
			c.cb.OnStreamClosed(1, costNode)
		}
	})
	c.ask(resource.ClusterType, nil, "")
	c.ask(resource.EndpointType, c.names, "")
	// The clusters wait for their load assignments, which the client asks for: those first.
	if c.answer(resource.EndpointType)+c.answer(resource.ClusterType) < 2 {
		tb.Fatal("want the clusters and their load assignments")
	}
	return c
}

// set makes the cache serve the n clusters, and their load assignments at version, but
// assignment i at iVersion.
func (c *ackingClient) set(i, iVersion int) {
	var cs, es []types.Resource
	for k, name := range c.names {
		cs = append(cs, edsCluster(name, cluster.Cluster_ROUND_ROBIN))
		port := uint32(1)
		if k == i {
			port = uint32(iVersion)
		}
		es = append(es, endpointsOn(name, port))
	}
	s, err := cache.NewSnapshot(fmt.Sprint(iVersion), map[resource.Type][]types.Resource{resource.ClusterType: cs, resource.EndpointType: es})
	if err != nil {
		c.tb.Fatal(err)
	}
	if err := c.snaps.SetSnapshot(context.Background(), costNode.Id, s); err != nil {
		c.tb.Fatal(err)
	}
}

// ask is the client's request of typeURL (names nil: every resource) answering nonce, and the
// server's watch after it.
func (c *ackingClient) ask(typeURL string, names []string, nonce string) {
	if c.delta {
		req := &discovery.DeltaDiscoveryRequest{Node: costNode, TypeUrl: typeURL, ResponseNonce: nonce}
		if nonce == "" {
			req.ResourceNamesSubscribe = names
		}
		if err := c.cb.OnStreamDeltaRequest(1, req); err != nil {
			c.tb.Fatal(err)
		}
		sub := c.subs[typeURL]
		if sub == nil {
			s := stream.NewDeltaSubscription(names, nil, nil, names == nil)
			sub = &s
			c.subs[typeURL], c.dout[typeURL] = sub, make(chan cache.DeltaResponse, 1)
		}
		if _, err := c.g.CreateDeltaWatch(req, sub, c.dout[typeURL]); err != nil {
			c.tb.Fatal(err)
		}
		return
	}
	req := &discovery.DiscoveryRequest{Node: costNode, TypeUrl: typeURL, ResourceNames: names, ResponseNonce: nonce}
	if err := c.cb.OnStreamRequest(1, req); err != nil {
		c.tb.Fatal(err)
	}
	sub := c.subs[typeURL]
	if sub == nil {
		s := stream.NewSotwSubscription(names, names == nil)
		sub = &s
		c.subs[typeURL], c.sotw[typeURL] = sub, make(chan cache.Response, 1)
	}
	if _, err := c.g.CreateWatch(req, sub, c.sotw[typeURL]); err != nil {
		c.tb.Fatal(err)
	}
}

// next waits for the response of typeURL (a minute at most), has the server send it with the next
// nonce, and returns the nonce ("" when none came).
func (c *ackingClient) next(typeURL string) string {
	c.nonce++
	nonce := fmt.Sprint(c.nonce)
	timeout := time.After(time.Minute)
	if c.delta {
		select {
		case r := <-c.dout[typeURL]:
			resp, _ := r.GetDeltaDiscoveryResponse()
			resp.Nonce = nonce
			c.cb.OnStreamDeltaResponse(1, r.GetDeltaRequest(), resp)
		case <-timeout:
			return ""
		}
		return nonce
	}
	select {
	case r := <-c.sotw[typeURL]:
		resp, _ := r.GetDiscoveryResponse()
		resp.Nonce = nonce
		c.cb.OnStreamResponse(context.Background(), 1, r.GetRequest(), resp)
	case <-timeout:
		return ""
	}
	return nonce
}

// answer takes the response of typeURL and ACKs it: it returns 1, or 0 when none came.
func (c *ackingClient) answer(typeURL string) int {
	nonce := c.next(typeURL)
	if nonce == "" {
		return 0
	}
	var names []string
	if typeURL == resource.EndpointType {
		names = c.names
	}
	c.ask(typeURL, names, nonce)
	return 1
}

// An ACK of a response that brought one load assignment, to a client that holds n clusters and
// their n load assignments: the request callback and the next watch, the update and its
// response left out.
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
					c.set(version%n, version)
					nonce := c.next(resource.EndpointType)
					if nonce == "" {
						b.Fatal("want one response, of the update")
					}
					b.StartTimer()
					c.ask(resource.EndpointType, c.names, nonce)
				}
			})
		}
	}
}

// An ACK costs what it answered and what depends on it, not every name the client holds: an
// ACK of one updated load assignment makes about as many allocations for a client of 10,000
// clusters and load assignments as for one of 10.
func TestAnACKCostsWhatItAnsweredNotEveryNameTheClientHolds(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "sotw", true: "delta"}[delta], func(t *testing.T) {
			g := NewWithT(t)
			allocs := map[int]float64{}
			for _, n := range []int{10, 10000} {
				allocs[n] = ackAllocs(t, newAckingClient(t, delta, n), n)
			}
			g.Expect(allocs[10000]).To(BeNumerically("<=", allocs[10]+4), "allocations of an ACK, by names held")
		})
	}
}

// ackAllocs is the allocations of an ACK of c: an update of one of its n load assignments, then
// the ACK of its response, measured; the fewest of 20 ACKs, as what other goroutines allocate
// meanwhile (a loaded machine's, the race detector's) only ever adds to a reading.
func ackAllocs(t *testing.T, c *ackingClient, n int) float64 {
	const runs = 20
	var ms runtime.MemStats
	fewest := uint64(math.MaxUint64)
	for v := 2; v < 2+runs; v++ {
		c.set(v%n, v)
		nonce := c.next(resource.EndpointType)
		if nonce == "" {
			t.Fatal("want one response, of the update")
		}
		runtime.GC()                   // the feed's work on the update done
		procs := runtime.GOMAXPROCS(1) // the ACK's allocations, not another goroutine's meanwhile
		runtime.ReadMemStats(&ms)
		before := ms.Mallocs
		c.ask(resource.EndpointType, c.names, nonce)
		runtime.ReadMemStats(&ms)
		runtime.GOMAXPROCS(procs)
		fewest = min(fewest, ms.Mallocs-before)
	}
	return float64(fewest)
}

// endpointsOn is a load assignment of cluster name with one endpoint on port.
func endpointsOn(name string, port uint32) *endpoint.ClusterLoadAssignment {
	return &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{{LbEndpoints: []*endpoint.LbEndpoint{{
		HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: &core.Address{Address: &core.Address_SocketAddress{
			SocketAddress: &core.SocketAddress{Address: "10.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: port}}}}}}}}}}}
}
