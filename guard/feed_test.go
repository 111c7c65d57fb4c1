package guard_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

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

// Clients that come and go while the cache changes: the shared watch starts with a type's first
// client and stops with its last, again and again; a client gets every cluster served when it
// asks, and what is added while it stays; and nothing is left behind once they leave (no watch
// of the cache, and no goroutine: TestMain's goleak).
func TestClientsThatComeAndGoWhileTheCacheChanges(t *testing.T) {
	g := NewWithT(t)
	clusters := cache.NewLinearCache(resource.ClusterType)
	gd, err := guard.New(clusters, guard.Options{}) // a LinearCache: shared without asking
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ads := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, gd, gd.Callbacks(nil)))

	var served atomic.Int64 // clusters c-0 ... c-(served-1) are in the cache
	add := func() error {
		name := fmt.Sprintf("c-%03d", served.Load())
		if err := clusters.UpdateResource(name, edsCluster(name, cluster.Cluster_ROUND_ROBIN)); err != nil {
			return err
		}
		served.Add(1)
		return nil
	}
	g.Expect(add()).To(Succeed())

	// A client: it asks for every cluster, and takes responses (ACKing each) until one holds at
	// least want clusters.
	type client struct {
		st    discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
		leave context.CancelFunc
	}
	open := func(node string) (*client, error) {
		cctx, leave := context.WithTimeout(ctx, 10*time.Second) // a client never answered fails

		st, err := ads.StreamAggregatedResources(cctx)
		if err == nil {
			err = st.Send(&discovery.DiscoveryRequest{Node: nodeOf(node), TypeUrl: resource.ClusterType})
		}
		if err != nil {
			leave()
			return nil, err
		}
		return &client{st: st, leave: leave}, nil
	}
	until := func(c *client, want int) error {
		for {
			r, err := c.st.Recv()
			if err != nil {
				return err
			}
			if err := c.st.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()}); err != nil {
				return err
			}
			if len(r.GetResources()) >= want {
				return nil
			}
		}
	}

	// While clusters are added: six clients come and go, thirty times each, then one client
	// alone, thirty times (the shared watch stops and starts again each time).
	stop := make(chan struct{})
	errs := make(chan error, 8)
	var writer sync.WaitGroup
	writer.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				if err := add(); err != nil {
					errs <- err
					return
				}
			}
		}
	})
	comeAndGo := func(who string, times int) error {
		for j := range times {
			c, err := open(fmt.Sprintf("%s-%d", who, j))
			if err != nil {
				return err
			}
			err = until(c, int(served.Load()))
			c.leave()
			if err != nil {
				return fmt.Errorf("%s, time %d: %w", who, j, err)
			}
		}
		return nil
	}
	var clients sync.WaitGroup
	for i := range 6 {
		clients.Go(func() {
			if err := comeAndGo(fmt.Sprintf("client-%d", i), 30); err != nil {
				errs <- err
			}
		})
	}
	clients.Wait()
	if err := comeAndGo("alone", 30); err != nil {
		errs <- err
	}
	close(stop)
	writer.Wait()
	close(errs)
	for err := range errs {
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Eventually(clusters.NumWildcardWatches, 5*time.Second).Should(BeZero(), "the last client left: so did the shared watch")

	// A client that comes now gets every cluster, and one added while it stays.
	c, err := open("late")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(until(c, int(served.Load()))).To(Succeed())
	g.Expect(add()).To(Succeed())
	g.Expect(until(c, int(served.Load()))).To(Succeed())
	// One shared watch: the feed opens it again once it has told the streams of the answer, so a
	// client can hold the answer a moment before the watch is back.
	g.Eventually(clusters.NumWildcardWatches, 5*time.Second).Should(Equal(1))
	g.Consistently(clusters.NumWildcardWatches, 100*time.Millisecond).Should(Equal(1))
	c.leave()
	g.Eventually(clusters.NumWildcardWatches, 5*time.Second).Should(BeZero())
}

// A resource the wrapped cache cannot encode (a string field that is not UTF-8: go-control-plane
// then fails its whole answer, and stock's server ends every client's stream with the error) is
// left out: the client gets the type's other resources and their changes, and the resource
// itself once it is fixed. Whether the streams share the cache's watch or not.
func TestAResourceTheCacheCannotEncodeIsLeftOut(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "shared", false: "one a stream"}[shared], func(t *testing.T) {
			g := NewWithT(t)
			clusters := cache.NewLinearCache(resource.ClusterType)
			var inner cache.Cache = &countingCache{Cache: muxOf(clusters)} // not seen as a MuxCache: a watch per node
			if shared {
				inner = muxOf(clusters)
			}
			gd, err := guard.New(inner, guard.Options{})
			g.Expect(err).NotTo(HaveOccurred())
			defer gd.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			st, err := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, gd, gd.Callbacks(nil))).StreamAggregatedResources(ctx)
			g.Expect(err).NotTo(HaveOccurred())

			bad := &cluster.Cluster{Name: "bad", AltStatName: "not UTF-8: \xff"}
			g.Expect(clusters.UpdateResource("a", edsCluster("a", cluster.Cluster_ROUND_ROBIN))).To(Succeed())
			g.Expect(clusters.UpdateResource("bad", bad)).To(Succeed())
			next := func() (*discovery.DiscoveryResponse, cluster.Cluster_LbPolicy) {
				r, err := st.Recv()
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(st.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()})).To(Succeed())
				var a cluster.Cluster
				for _, res := range r.GetResources() {
					if res.UnmarshalTo(&a) == nil && a.GetName() == "a" {
						return r, a.GetLbPolicy()
					}
				}
				return r, -1
			}
			g.Expect(st.Send(&discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: resource.ClusterType})).To(Succeed())
			r, lb := next()
			g.Expect(names(r)).To(Equal([]string{"a"}), "the bad one left out")
			g.Expect(lb).To(Equal(cluster.Cluster_ROUND_ROBIN))

			g.Expect(clusters.UpdateResource("a", edsCluster("a", cluster.Cluster_LEAST_REQUEST))).To(Succeed())
			r, lb = next()
			g.Expect(names(r)).To(Equal([]string{"a"}))
			g.Expect(lb).To(Equal(cluster.Cluster_LEAST_REQUEST), "a change of another resource of the type goes through")

			g.Expect(clusters.UpdateResource("bad", &cluster.Cluster{Name: "bad", AltStatName: "fixed"})).To(Succeed())
			r, _ = next()
			g.Expect(names(r)).To(Equal([]string{"a", "bad"}), "fixed, it goes too")
		})
	}
}

// Served through the guard's codec, every SotW client of the whole type gets every cluster as
// it was set, version after version, and a delta client too (its responses are encoded as
// gRPC's codec does). The engine's TestTheCodecWritesASotwResponseOfAWholeTypeFromOneEncoding
// shows the sharing itself.
func TestClientsServedThroughTheCodecGetWhatWasSet(t *testing.T) {
	g := NewWithT(t)
	clusters := cache.NewLinearCache(resource.ClusterType)
	gd, err := guard.New(muxOf(clusters), guard.Options{NodeIndependent: true})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn := serve(t, ctx, gd, gd.Callbacks(nil), grpc.ForceServerCodecV2(gd.Codec()))
	set := map[string]*cluster.Cluster{}
	put := func(name string, lb cluster.Cluster_LbPolicy) {
		c := edsCluster(name, lb).(*cluster.Cluster)
		set[name] = c
		g.Expect(clusters.UpdateResource(name, c)).To(Succeed())
	}
	for i := range 50 {
		put(fmt.Sprintf("c%02d", i), cluster.Cluster_ROUND_ROBIN)
	}
	same := func(rs []*anypb.Any) {
		g.Expect(rs).To(HaveLen(len(set)))
		for _, a := range rs {
			var c cluster.Cluster
			g.Expect(a.UnmarshalTo(&c)).To(Succeed())
			g.Expect(proto.Equal(&c, set[c.GetName()])).To(BeTrue(), c.GetName())
		}
	}

	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	var sotw []discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	for _, node := range []string{"one", "two"} {
		st, err := ads.StreamAggregatedResources(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(st.Send(&discovery.DiscoveryRequest{Node: nodeOf(node), TypeUrl: resource.ClusterType})).To(Succeed())
		sotw = append(sotw, st)
	}
	dst, err := ads.DeltaAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(dst.Send(&discovery.DeltaDiscoveryRequest{Node: nodeOf("three"), TypeUrl: resource.ClusterType})).To(Succeed())
	for round := range 3 {
		for _, st := range sotw {
			r, err := st.Recv()
			g.Expect(err).NotTo(HaveOccurred())
			same(r.GetResources())
			g.Expect(r.GetTypeUrl()).To(Equal(resource.ClusterType))
			g.Expect(st.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()})).To(Succeed())
		}
		d, err := dst.Recv()
		g.Expect(err).NotTo(HaveOccurred())
		var got []*anypb.Any
		for _, r := range d.GetResources() {
			got = append(got, r.GetResource())
		}
		if round == 0 {
			same(got)
		} else {
			g.Expect(deltaNames(d)).To(Equal([]string{fmt.Sprintf("c%02d", round)}))
		}
		g.Expect(dst.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: d.GetNonce()})).To(Succeed())
		put(fmt.Sprintf("c%02d", round+1), cluster.Cluster_LEAST_REQUEST)
	}
}

// teamHash is a SnapshotCache's node hash: a node id's part before its slash.
type teamHash struct{}

func (teamHash) ID(n *core.Node) string { team, _, _ := strings.Cut(n.GetId(), "/"); return team }

// Told the SnapshotCache's node hash, the guard keeps one watch of it per ID the hash makes: the
// two nodes of one team share their team's watch, the other team has its own, and each client
// gets its team's snapshot.
func TestNodesOneNodeHashIDShareOneWatch(t *testing.T) {
	g := NewWithT(t)
	snapshots := cache.NewSnapshotCache(true, teamHash{}, nil)
	counting := &countingCache{Cache: snapshots}
	gd, err := guard.New(counting, guard.Options{NodeHash: teamHash{}})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	for team, name := range map[string]string{"a": "for-a", "b": "for-b"} {
		s, err := cache.NewSnapshot("1", map[resource.Type][]types.Resource{resource.ClusterType: {edsCluster(name, cluster.Cluster_ROUND_ROBIN)}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(snapshots.SetSnapshot(context.Background(), team, s)).To(Succeed())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ads := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, gd, gd.Callbacks(nil)))
	for _, node := range []string{"a/1", "a/2", "b/1"} {
		st, err := ads.StreamAggregatedResources(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(st.Send(&discovery.DiscoveryRequest{Node: nodeOf(node), TypeUrl: resource.ClusterType})).To(Succeed())
		r, err := st.Recv()
		g.Expect(err).NotTo(HaveOccurred())
		team, _, _ := strings.Cut(node, "/")
		g.Expect(names(r)).To(Equal([]string{"for-" + team}), node)
	}
	// One watch a team answered, and one a team waiting for the next version.
	g.Eventually(counting.watches.Load).Should(BeNumerically("==", 4))
	g.Consistently(counting.watches.Load, 100*time.Millisecond).Should(BeNumerically("==", 4))
}

// The streams of one NodeHash ID, many of them, are each given the ID's new snapshot (published
// to them one goroutine a core).
func TestEveryStreamOfANodeHashIDGetsItsChange(t *testing.T) {
	g := NewWithT(t)
	snapshots := cache.NewSnapshotCache(true, teamHash{}, nil)
	gd, err := guard.New(snapshots, guard.Options{NodeHash: teamHash{}})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	set := func(version string, lb cluster.Cluster_LbPolicy) {
		s, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.ClusterType: {edsCluster("c", lb)}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(snapshots.SetSnapshot(context.Background(), "a", s)).To(Succeed())
	}
	set("1", cluster.Cluster_ROUND_ROBIN)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a stream never given it fails
	defer cancel()
	ads := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, gd, gd.Callbacks(nil)))
	var streams []discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	for i := range 300 {
		st, err := ads.StreamAggregatedResources(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(st.Send(&discovery.DiscoveryRequest{Node: nodeOf(fmt.Sprintf("a/%d", i)), TypeUrl: resource.ClusterType})).To(Succeed())
		r, err := st.Recv()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(st.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()})).To(Succeed())
		streams = append(streams, st)
	}
	set("2", cluster.Cluster_LEAST_REQUEST)
	for i, st := range streams {
		r, err := st.Recv()
		g.Expect(err).NotTo(HaveOccurred())
		var c cluster.Cluster
		g.Expect(r.GetResources()[0].UnmarshalTo(&c)).To(Succeed())
		g.Expect(c.GetLbPolicy()).To(Equal(cluster.Cluster_LEAST_REQUEST), "stream %d", i)
	}
}
