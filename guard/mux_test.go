package guard_test

import (
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/guard"
)

// names of a SotW or delta response xdsStream received.
func namesOfAny(r any) []string {
	if d, ok := r.(*discovery.DeltaDiscoveryResponse); ok {
		return deltaNames(d)
	}
	return names(r.(*discovery.DiscoveryResponse))
}

// A MuxCache of LinearCaches given with the default options is shared: two nodes (a SotW client
// and a delta one) get its clusters from one watch of it. A MuxCache that also holds a
// SnapshotCache (it answers by node) keeps a watch per node.
func TestAMuxCacheOfLinearCachesIsSharedWithoutTelling(t *testing.T) {
	for _, withSnapshot := range []bool{false, true} {
		t.Run(map[bool]string{false: "linear caches", true: "and a snapshot cache"}[withSnapshot], func(t *testing.T) {
			g := NewWithT(t)
			clusters := cache.NewLinearCache(resource.ClusterType)
			mux := muxOf(clusters)
			watches := 1
			if withSnapshot {
				mux.Caches[resource.EndpointType], watches = cache.NewSnapshotCache(false, cache.IDHash{}, nil), 2
			}
			g.Expect(clusters.UpdateResource("a", edsCluster("a", cluster.Cluster_ROUND_ROBIN))).To(Succeed())
			gd, err := guard.New(mux, guard.Options{})
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(gd.Close)
			ctx := t.Context()
			conn := serve(t, ctx, gd, gd.Callbacks(nil))
			for i, node := range []string{"one", "two"} {
				x := openStream(t, conn, i == 1)
				x.ask(t, node, resource.ClusterType, nil, nil)
				var r any
				g.Eventually(x.in, 5*time.Second).Should(Receive(&r), node)
				g.Expect(namesOfAny(r)).To(Equal([]string{"a"}), node)
			}
			g.Eventually(clusters.NumWildcardWatches).Should(Equal(watches))
			g.Consistently(clusters.NumWildcardWatches, 200*time.Millisecond).Should(Equal(watches))
		})
	}
}

// A shared MuxCache whose Classify routes a type by node would serve the first node's resources
// to every other: a stream of a node routed elsewhere (or for which Classify panics) is refused
// with FailedPrecondition, naming the fix, Options.NodeHash; given it, each node gets its own.
// A stream's type is routed as its first request's node, whatever node its later requests name.
func TestAMuxCacheThatRoutesByNodeIsRefusedUnlessGivenANodeHash(t *testing.T) {
	for _, hash := range []cache.NodeHash{nil, cache.IDHash{}} {
		t.Run(map[bool]string{true: "default options", false: "NodeHash"}[hash == nil], func(t *testing.T) {
			g := NewWithT(t)
			byNode := map[string]cache.Cache{}
			for _, node := range []string{"a", "b"} {
				lc := cache.NewLinearCache(resource.ClusterType)
				g.Expect(lc.UpdateResource("of-"+node, edsCluster("of-"+node, cluster.Cluster_ROUND_ROBIN))).To(Succeed())
				byNode[node] = lc
			}
			classify := func(id string) string {
				if byNode[id] == nil {
					panic("no cache for node " + id)
				}
				return id
			}
			mux := &cache.MuxCache{
				Classify:      func(r *cache.Request) string { return classify(r.GetNode().GetId()) },
				ClassifyDelta: func(r *cache.DeltaRequest) string { return classify(r.GetNode().GetId()) },
				Caches:        byNode,
			}
			gd, err := guard.New(mux, guard.Options{NodeHash: hash})
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(gd.Close)
			conn := serve(t, t.Context(), gd, gd.Callbacks(nil))
			for _, node := range []string{"a", "b", "c"} {
				if hash != nil && node == "c" {
					break // a node the MuxCache has no cache for is the MuxCache's to refuse
				}
				x := openStream(t, conn, node == "a") // delta: the server leaves a later request's node out
				x.ask(t, node, resource.ClusterType, nil, nil)
				if hash != nil || node == "a" {
					var r any
					g.Eventually(x.in, 5*time.Second).Should(Receive(&r), node)
					g.Expect(namesOfAny(r)).To(Equal([]string{"of-" + node}))
					// A later request names no node: its type is routed as the stream's node's.
					if node == "a" {
						g.Expect(x.delta.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType})).To(Succeed())
						g.Consistently(x.ended, 200*time.Millisecond).ShouldNot(Receive())
					}
					continue
				}
				var err error
				g.Eventually(x.ended, 5*time.Second).Should(Receive(&err), node)
				g.Expect(status.Code(err)).To(Equal(codes.FailedPrecondition), "%v", err)
				g.Expect(err.Error()).To(ContainSubstring("Options.NodeHash"))
				want := `of node "b" to "b"`
				if node == "c" {
					want = `of node "c" to "a panic: no cache for node c"`
				}
				g.Expect(err.Error()).To(ContainSubstring(`of node "a" to "a" and ` + want))
			}
			refused := map[bool]float64{true: 2, false: 0}[hash == nil]
			g.Expect(refusalsOf(gd.Collector())).To(HaveKeyWithValue("invalid", refused))
		})
	}
}
