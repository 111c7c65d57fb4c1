package guard_test

import (
	"context"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/guard"
)

// The streams of a cache that answers every node alike share one watch of it per type: three
// clients (two SotW, one delta) cost the wrapped cache one watch a version, not three, and each
// still gets every version. When the last of them leaves, the shared watch goes too. Without
// NodeIndependent, each stream keeps its own watch, as a SnapshotCache needs.
func TestStreamsOfANodeIndependentCacheShareOneWatchOfIt(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "shared", false: "one a stream"}[shared], func(t *testing.T) {
			g := NewWithT(t)
			clusters := cache.NewLinearCache(resource.ClusterType)
			counting := &countingCache{Cache: muxOf(clusters)}
			gd, err := guard.New(counting, guard.Options{NodeIndependent: shared})
			g.Expect(err).NotTo(HaveOccurred())
			defer gd.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			conn := serve(t, ctx, gd, gd.Callbacks(nil))
			g.Expect(clusters.UpdateResource("a", edsCluster("a", cluster.Cluster_ROUND_ROBIN))).To(Succeed())

			// Two SotW clients and a delta one, each with its own context to leave with.
			ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
			var leave []context.CancelFunc
			var sotw []discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
			for _, node := range []string{"one", "two"} {
				sctx, scancel := context.WithCancel(ctx)
				leave = append(leave, scancel)
				st, err := ads.StreamAggregatedResources(sctx)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(st.Send(&discovery.DiscoveryRequest{Node: nodeOf(node), TypeUrl: resource.ClusterType})).To(Succeed())
				sotw = append(sotw, st)
			}
			dctx, dcancel := context.WithCancel(ctx)
			leave = append(leave, dcancel)
			dst, err := ads.DeltaAggregatedResources(dctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(dst.Send(&discovery.DeltaDiscoveryRequest{Node: nodeOf("three"), TypeUrl: resource.ClusterType})).To(Succeed())

			// Each gets a, and ACKs it.
			for i, st := range sotw {
				r, err := st.Recv()
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(names(r)).To(Equal([]string{"a"}), "SotW client %d", i)
				g.Expect(st.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()})).To(Succeed())
			}
			d, err := dst.Recv()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(deltaNames(d)).To(Equal([]string{"a"}))
			g.Expect(dst.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: d.GetNonce()})).To(Succeed())

			watches := 3 // the wrapped cache's watches open for the next version
			if shared {
				watches = 1
			}
			g.Eventually(clusters.NumWildcardWatches).Should(Equal(watches))
			made := counting.watches.Load()
			g.Expect(made).To(BeNumerically("==", 2*watches), "a watch answered with a, and one waiting for the next version")

			// A new version reaches every client, for one more watch of the wrapped cache each
			// time it is shared.
			g.Expect(clusters.UpdateResource("a", edsCluster("a", cluster.Cluster_LEAST_REQUEST))).To(Succeed())
			for i, st := range sotw {
				r, err := st.Recv()
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(names(r)).To(Equal([]string{"a"}), "SotW client %d", i)
				var a cluster.Cluster
				g.Expect(r.GetResources()[0].UnmarshalTo(&a)).To(Succeed())
				g.Expect(a.GetLbPolicy()).To(Equal(cluster.Cluster_LEAST_REQUEST), "SotW client %d", i)
			}
			d, err = dst.Recv()
			g.Expect(err).NotTo(HaveOccurred())
			var a cluster.Cluster
			g.Expect(d.GetResources()[0].GetResource().UnmarshalTo(&a)).To(Succeed())
			g.Expect(a.GetLbPolicy()).To(Equal(cluster.Cluster_LEAST_REQUEST))
			g.Eventually(counting.watches.Load).Should(BeNumerically("==", made+int64(watches)))
			g.Consistently(counting.watches.Load, 200*time.Millisecond).Should(BeNumerically("==", made+int64(watches)))

			// The clients leave: no watch of the wrapped cache is left behind.
			for _, l := range leave {
				l()
			}
			g.Eventually(clusters.NumWildcardWatches, 5*time.Second).Should(BeZero())
		})
	}
}
