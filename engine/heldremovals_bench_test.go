package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// What a client with many names costs the engine when some names it holds are no longer served
// but kept (held removals), measured on one SotW stream driven through the tracker's callbacks and
// the cache's watches, without gRPC:
//
//	go test -run '^$' -bench CostOfHeldRemovals -benchtime 200x ./engine/
//
// It is the guard's BenchmarkCostOfHeldRemovals (e83364c, issue 48; deleted with the guard's own
// engine in a95f814) on the engine that serves the guard now.

// keepReferenced is a Withholder of held removals alone, as the guard's Envoy holds keep them
// (guard/holds.go, envoyHolds.Keep): a name no longer served stays with the client while
// something it holds references it, and a Cluster also while the client asks for it by name.
type keepReferenced struct{}

func (keepReferenced) Withhold(ClientView, *Entry) (string, *Entry) { return "", nil }

func (keepReferenced) Keep(c ClientView, typeURL, name string) string {
	if by := c.ReferencedBy(typeURL, name); by != "" {
		return "removed, kept while the client holds " + by + ", which references it"
	}
	if typeURL == resourcev3.ClusterType && c.Asks(typeURL, name) && !c.AsksAll(typeURL) {
		return "removed, kept while the client asks for it"
	}
	return ""
}

// heldRemovals is a SotW stream whose client asks by name, as grpc-go asks, for n EDS clusters
// (c00000...) and their n load assignments, and holds (ACKed) every one; then the cache serves
// neither the first `removed` clusters, which nothing references, nor the next `removed` load
// assignments, which clusters the client holds reference: the client keeps them all. It returns
// the stream's session and the names no longer served, by type URL.
func heldRemovals(b *testing.B, n, removed int) (*Cache, *Session, map[string][]string) {
	c := NewCache([]string{resourcev3.ClusterType, resourcev3.EndpointType})
	c.SetWithholder(keepReferenced{})
	tr := NewTracker(c)
	entry := func(typeURL, name string, m proto.Message, refs []Ref) *Entry {
		a, err := anypb.New(m)
		if err != nil {
			b.Fatal(err)
		}
		e := &Entry{TypeURL: typeURL, Name: name, Version: "1", Any: a, Refs: refs, Wire: &discovery.Resource{Name: name, Version: "1", Resource: a}}
		if err := e.EncodeWire(); err != nil {
			b.Fatal(err)
		}
		return e
	}
	var entries []*Entry
	var names []string
	for i := range n {
		name := fmt.Sprintf("c%05d", i)
		names = append(names, name)
		entries = append(entries,
			entry(resourcev3.ClusterType, name, &cluster.Cluster{Name: name}, []Ref{{TypeURL: resourcev3.EndpointType, Name: name}}),
			entry(resourcev3.EndpointType, name, &endpoint.ClusterLoadAssignment{ClusterName: name}, nil))
	}
	c.SetSnapshot(SnapshotOf(entries))

	ctx := context.Background()
	if err := tr.OnStreamOpen(ctx, 1, ""); err != nil {
		b.Fatal(err)
	}
	cancels := map[string]func(){}
	b.Cleanup(func() {
		for _, cancel := range cancels {
			cancel()
		}
		tr.OnStreamClosed(1, nil)
		c.Close()
	})
	node := &core.Node{Id: "client"}
	ask := func(typeURL, nonce string, out chan cache.Response) {
		req := &discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names, ResponseNonce: nonce}
		if err := tr.OnStreamRequest(1, req); err != nil {
			b.Fatal(err)
		}
		if cancel := cancels[typeURL]; cancel != nil {
			cancel()
		}
		cancel, err := c.CreateWatch(req, stream.NewSotwSubscription(names, true), out)
		if err != nil {
			b.Fatal(err)
		}
		cancels[typeURL] = cancel
	}
	// The load assignments first: what the clusters reference is with the client before them.
	for i, typeURL := range []string{resourcev3.EndpointType, resourcev3.ClusterType} {
		out := make(chan cache.Response, 1)
		ask(typeURL, "", out)
		select {
		case r := <-out:
			resp, err := r.GetDiscoveryResponse()
			if err != nil {
				b.Fatal(err)
			}
			if len(resp.Resources) != n {
				b.Fatalf("the first %s response carries %d resources, want %d", shortType(typeURL), len(resp.Resources), n)
			}
			resp.Nonce = fmt.Sprint(i + 1)
			tr.OnStreamResponse(ctx, 1, r.GetRequest(), resp)
			ask(typeURL, resp.Nonce, out)
		case <-time.After(time.Minute):
			b.Fatalf("no %s response", shortType(typeURL))
		}
	}

	gone := map[string][]string{resourcev3.ClusterType: names[:removed], resourcev3.EndpointType: names[removed : 2*removed]}
	c.SetSnapshot(c.Snapshot().Update(nil, gone))
	st := c.Session(sotwID(1))
	st.mu.Lock()
	defer st.mu.Unlock()
	for typeURL, ns := range gone {
		ks := st.kinds.get(c, typeURL)
		if len(ks.kept) != len(ns) {
			b.Fatalf("the client keeps %d %s no longer served, want %d", len(ks.kept), shortType(typeURL), len(ns))
		}
	}
	return c, st, gone
}

// The evaluation of a type's held removals: each name the client holds that is no longer served
// asks the Withholder whether the client keeps it, which asks what the client holds that
// references it (ClientView.ReferencedBy). Its cost should follow what references the name, not
// the names the client holds: at 100 and 10,000 names held, the same 10 removals. Clusters are
// referenced by nothing the client holds (kept because it asks for them); load assignments by a
// cluster it holds. ns/removal is one removal's share of an op.
func BenchmarkCostOfHeldRemovals(b *testing.B) {
	const removed = 10
	for _, n := range []int{100, 10000} {
		for _, typeURL := range []string{resourcev3.ClusterType, resourcev3.EndpointType} {
			b.Run(fmt.Sprintf("names=%d/removed=%d/%s", n, removed, shortType(typeURL)), func(b *testing.B) {
				c, st, gone := heldRemovals(b, n, removed)
				st.mu.Lock()
				ks := st.kinds.get(c, typeURL)
				st.mu.Unlock()
				b.ReportAllocs()
				for b.Loop() {
					st.mu.Lock()
					for _, name := range gone[typeURL] {
						ks.markDirty(name)
					}
					c.evaluateLocked(st, ks, nil)
					st.mu.Unlock()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/removed, "ns/removal")
				st.mu.Lock()
				defer st.mu.Unlock()
				if len(ks.kept) != removed || ks.watch == nil || ks.watch.answered || len(st.queue) > 0 {
					b.Fatalf("the client keeps %d names (want %d), and was sent something (%v)", len(ks.kept), removed, len(st.queue) > 0)
				}
			})
		}
	}
}
