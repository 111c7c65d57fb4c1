package guard_test

import (
	"bytes"
	"context"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"log/slog"
	"sync"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kds-host/kds-host/guard"
	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	"github.com/kds-host/kds-host/shared"
)

// kds-host's cache with owner holds for Envoy types: the reference owner-check library, with
// EnvoyReferences as the owners, keeps a route switched to a cluster the client refuses from a
// delta client (the route names a cluster the client does not hold), with the plugin's reason,
// and sends it once the client has accepted the cluster.
func TestKDSCacheHoldsARouteUntilTheClientHasItsCluster(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := guard.NewCache([]string{resource.ClusterType, resource.RouteType},
		guard.Options{Owners: guard.EnvoyReferences, OwnerCheck: func() shared.OwnerCheck { return ownerpredict.New() }})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	set := func(rc *route.RouteConfiguration, clusters ...types.Resource) {
		g.Expect(c.SetResources(map[string][]types.Resource{resource.RouteType: {rc}, resource.ClusterType: clusters})).To(Succeed())
	}
	// Through the cache's codec: what it sends is written from the snapshot's encoding.
	st, err := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, c, c.Callbacks(nil), grpc.ForceServerCodecV2(c.Codec()))).DeltaAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())

	set(routeTo("c1"), staticCluster("c1", cluster.Cluster_ROUND_ROBIN))
	for _, typeURL := range []string{resource.ClusterType, resource.RouteType} {
		g.Expect(st.Send(&discovery.DeltaDiscoveryRequest{Node: nodeOf("client"), TypeUrl: typeURL, ResourceNamesSubscribe: []string{"*"}})).To(Succeed())
	}
	in := make(chan *discovery.DeltaDiscoveryResponse, 100)
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			in <- r
		}
	}()
	var routes [][]string // the clusters of each route configuration the client got
	// run answers as an Envoy-like client (refusing clusters with lb_policy MAGLEV) until quiet.
	run := func() {
		for r := recvDelta(t, in, time.Second); r != nil; r = recvDelta(t, in, time.Second) {
			req := &discovery.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()}
			for _, res := range r.GetResources() {
				switch r.GetTypeUrl() {
				case resource.ClusterType:
					var cl cluster.Cluster
					g.Expect(res.GetResource().UnmarshalTo(&cl)).To(Succeed())
					if cl.GetLbPolicy() == cluster.Cluster_MAGLEV {
						req.ErrorDetail = &rpcstatus.Status{Code: 3, Message: `resource "` + cl.GetName() + `": unsupported lb policy MAGLEV`}
					}
				case resource.RouteType:
					var rc route.RouteConfiguration
					g.Expect(res.GetResource().UnmarshalTo(&rc)).To(Succeed())
					plain, _ := routesTo(&rc)
					routes = append(routes, plain)
				}
			}
			g.Expect(st.Send(req)).To(Succeed())
		}
	}
	run()
	g.Expect(routes).To(Equal([][]string{{"c1"}}))

	set(routeTo("c2"), staticCluster("c1", cluster.Cluster_ROUND_ROBIN), staticCluster("c2", cluster.Cluster_MAGLEV))
	run()
	g.Expect(routes).To(Equal([][]string{{"c1"}}), "no route to the refused cluster reached the client")
	var w []guard.Withheld
	for _, ti := range c.Clients()[0].Types {
		if ti.TypeURL == resource.RouteType {
			w = ti.Withheld
		}
	}
	g.Expect(w).To(ConsistOf(And(HaveField("Name", "r"), HaveField("Reason", And(HavePrefix("WAIT"), ContainSubstring("c2"))))))

	set(routeTo("c2"), staticCluster("c1", cluster.Cluster_ROUND_ROBIN), staticCluster("c2", cluster.Cluster_ROUND_ROBIN))
	run()
	g.Expect(routes).To(Equal([][]string{{"c1"}, {"c2"}}), "the route goes once the client has its cluster")
}

// Each resource set is encoded once: every response that carries a version, whatever its
// stream, is written (through the cache's codec) from the same bytes. A client decodes what it
// was sent.
func TestKDSCacheEncodesAVersionOnceForEveryClient(t *testing.T) {
	g := NewWithT(t)
	c, err := guard.NewCache([]string{resource.ClusterType}, guard.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	g.Expect(c.SetResources(map[string][]types.Resource{resource.ClusterType: {
		staticCluster("a", cluster.Cluster_ROUND_ROBIN), staticCluster("b", cluster.Cluster_LEAST_REQUEST)}})).To(Succeed())
	var rs []*discovery.Resource
	for _, e := range guard.SnapshotOf(c).Type(resource.ClusterType) {
		rs = append(rs, e.Wire)
	}
	var written [][]byte
	for _, nonce := range []string{"1", "2"} { // two streams' responses
		resp := &discovery.DeltaDiscoveryResponse{TypeUrl: resource.ClusterType, Nonce: nonce, Resources: rs}
		b, err := c.Codec().Marshal(resp)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(b).To(HaveLen(1+len(rs)), "its own fields, then each resource's encoding")
		var got discovery.DeltaDiscoveryResponse
		g.Expect(proto.Unmarshal(b.Materialize(), &got)).To(Succeed())
		g.Expect(proto.Equal(&got, resp)).To(BeTrue())
		written = append(written, b[1].ReadOnlyData())
	}
	g.Expect(&written[0][0]).To(BeIdenticalTo(&written[1][0]), "the same bytes for both")
}

// SetResources refuses what it cannot serve, and changes nothing then.
func TestKDSCacheRefusesWhatItCannotServe(t *testing.T) {
	g := NewWithT(t)
	_, err := guard.NewCache(nil, guard.Options{})
	g.Expect(err).To(MatchError("guard: NewCache needs the type URLs it serves"))
	_, err = guard.NewCache([]string{resource.ClusterType, resource.ClusterType}, guard.Options{})
	g.Expect(err).To(MatchError(ContainSubstring(`types[1] "type.googleapis.com/envoy.config.cluster.v3.Cluster": want a type URL (type.googleapis.com/...), each given once`)))
	_, err = guard.NewCache([]string{"bogus"}, guard.Options{})
	g.Expect(err).To(MatchError(`guard: NewCache types[0] "bogus": want a type URL (type.googleapis.com/...), each given once`))

	c, err := guard.NewCache([]string{resource.ClusterType}, guard.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	g.Expect(c.SetResources(map[string][]types.Resource{resource.ClusterType: {staticCluster("a", cluster.Cluster_ROUND_ROBIN)}})).To(Succeed())
	g.Expect(c.SetResources(map[string][]types.Resource{resource.RouteType: {routeTo("a")}})).To(MatchError(ContainSubstring("not one of the cache's")))
	g.Expect(c.SetResources(map[string][]types.Resource{resource.ClusterType: {staticCluster("", cluster.Cluster_ROUND_ROBIN)}})).To(MatchError(ContainSubstring("without a name")))
	g.Expect(c.SetResources(map[string][]types.Resource{resource.ClusterType: {
		staticCluster("a", cluster.Cluster_ROUND_ROBIN), staticCluster("a", cluster.Cluster_MAGLEV)}})).To(MatchError(ContainSubstring(`"a" given twice`)))
	g.Expect(guard.SnapshotOf(c).Type(resource.ClusterType)).To(HaveKey("a"), "what was served stays")
}

// A server made without the guard's callbacks refuses each client's first request, SotW and
// delta, with FailedPrecondition naming the fix; the server logs it and counts it. Both modes.
func TestAServerMadeWithoutTheCallbacksSaysSo(t *testing.T) {
	for _, mode := range []string{wrapped, kdsCache} {
		t.Run(mode, func(t *testing.T) {
			var log syncBuffer
			opts := guard.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))}
			if mode == wrapped {
				gd, err := guard.New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), opts)
				NewWithT(t).Expect(err).NotTo(HaveOccurred())
				defer gd.Close()
				refusedWithoutCallbacks(t, gd, gd, &log)
				return
			}
			c, err := guard.NewCache([]string{resource.ClusterType}, opts)
			NewWithT(t).Expect(err).NotTo(HaveOccurred())
			defer c.Close()
			refusedWithoutCallbacks(t, c, c, &log)
		})
	}
}

func refusedWithoutCallbacks(t *testing.T, c cache.Cache, ins insight, log *syncBuffer) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ads := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, c, server.CallbackFuncs{}))

	sotw, err := ads.StreamAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sotw.Send(&discovery.DiscoveryRequest{Node: nodeOf("a"), TypeUrl: resource.ClusterType})).To(Succeed())
	_, err = sotw.Recv()
	g.Expect(status.Code(err)).To(Equal(codes.FailedPrecondition))
	g.Expect(status.Convert(err).Message()).To(MatchRegexp(`the server must be made with them \(server.NewServer\(ctx, \w+, `))

	delta, err := ads.DeltaAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(delta.Send(&discovery.DeltaDiscoveryRequest{Node: nodeOf("b"), TypeUrl: resource.ClusterType})).To(Succeed())
	_, err = delta.Recv()
	g.Expect(status.Code(err)).To(Equal(codes.FailedPrecondition))

	g.Expect(log.String()).To(ContainSubstring("the server was made without the"))
	g.Expect(refusalsOf(ins.Collector())).To(HaveKeyWithValue("unbound", 2.0))
}

// syncBuffer is a bytes.Buffer for a log written from the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A delta client that never unsubscribes from a removed cluster's endpoints (Istio's does) is
// sent their removal once it no longer holds the cluster; until then they are kept (break after
// make).
func TestKDSCacheRemovesARemovedClustersEndpointsFromAClientThatStillAsks(t *testing.T) {
	g := NewWithT(t)
	c, err := guard.NewCache([]string{resource.ClusterType, resource.EndpointType}, guard.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	set := func(names ...string) {
		res := map[string][]types.Resource{}
		for _, n := range names {
			res[resource.ClusterType] = append(res[resource.ClusterType], edsCluster(n, cluster.Cluster_ROUND_ROBIN))
			res[resource.EndpointType] = append(res[resource.EndpointType], &endpoint.ClusterLoadAssignment{ClusterName: n})
		}
		g.Expect(c.SetResources(res)).To(Succeed())
	}
	set("a", "y")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, c, c.Callbacks(nil))).DeltaAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	node := nodeOf("istio")
	recv := func(typeURL string) *discovery.DeltaDiscoveryResponse {
		r, err := st.Recv()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.GetTypeUrl()).To(Equal(typeURL))
		return r
	}
	ack := func(r *discovery.DeltaDiscoveryResponse) {
		g.Expect(st.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()})).To(Succeed())
	}
	g.Expect(st.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ClusterType})).To(Succeed())
	ack(recv(resource.ClusterType))
	g.Expect(st.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"a", "y"}})).To(Succeed())
	ack(recv(resource.EndpointType))

	set("a") // cluster y and its endpoints go; the client keeps asking for y's endpoints
	removal := recv(resource.ClusterType)
	g.Expect(removal.GetRemovedResources()).To(ConsistOf("y"))
	ack(removal)
	r := recv(resource.EndpointType)
	g.Expect(r.GetRemovedResources()).To(ConsistOf("y"), "removed once the client no longer holds cluster y")
	ack(r)
}
