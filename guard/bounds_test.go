package guard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/guard"
)

// guardedServer is a go-control-plane server (SotW and delta) over a SnapshotCache that serves
// cluster "a" to node "client", guarded with opts, on loopback until the test ends.
func guardedServer(t *testing.T, opts guard.Options) (*guard.Guard, *grpc.ClientConn) {
	t.Helper()
	snap := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	s, err := cache.NewSnapshot("1", map[resource.Type][]types.Resource{resource.ClusterType: {staticCluster("a", cluster.Cluster_ROUND_ROBIN)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.SetSnapshot(context.Background(), "client", s); err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(snap, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		g.Close()
	})
	return g, serve(t, ctx, g, g.Callbacks(nil))
}

// xdsStream is one raw ADS stream, SotW or delta, that sends requests for type URLs and names.
type xdsStream struct {
	sotw  discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	delta discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	in    chan any   // responses
	ended chan error // the stream's end
	stop  context.CancelFunc
}

func openStream(t *testing.T, conn *grpc.ClientConn, delta bool) *xdsStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	x := &xdsStream{in: make(chan any, 100), ended: make(chan error, 1), stop: cancel}
	var recv func() (any, error)
	var err error
	if delta {
		x.delta, err = discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
		recv = func() (any, error) { return x.delta.Recv() }
	} else {
		x.sotw, err = discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		recv = func() (any, error) { return x.sotw.Recv() }
	}
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			r, err := recv()
			if err != nil {
				x.ended <- err
				return
			}
			x.in <- r
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return x
}

// ask sends a request of typeURL: SotW, the names it asks for; delta, the names it subscribes
// to, with initial versions of more names (delta only).
func (x *xdsStream) ask(t *testing.T, node, typeURL string, names []string, initial []string) {
	t.Helper()
	var err error
	if x.delta != nil {
		req := &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: typeURL, ResourceNamesSubscribe: names}
		if len(initial) > 0 {
			req.InitialResourceVersions = map[string]string{}
			for _, n := range initial {
				req.InitialResourceVersions[n] = "1"
			}
		}
		err = x.delta.Send(req)
	} else {
		err = x.sotw.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: typeURL, ResourceNames: names})
	}
	if err != nil {
		t.Fatal(err)
	}
}

func namesOf(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// refusalsOf is xds_guard_refusals_total by reason, as c collects it.
func refusalsOf(c prometheus.Collector) map[string]float64 {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, _ := reg.Gather()
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() == "xds_guard_refusals_total" {
			for _, m := range f.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// Each bound of a client stream refuses, with ResourceExhausted, the request that would pass it,
// SotW and delta alike, before the server stores it; the refusal is counted.
func TestAClientStreamsRequestPastABoundIsRefusedAndCounted(t *testing.T) {
	const other = "type.googleapis.com/made.up.Other"
	cases := []struct {
		name  string
		delta bool // delta only
		asks  func(t *testing.T, x *xdsStream)
		says  string
	}{
		{name: "a type past MaxTypesPerStream", says: "2 types at most", asks: func(t *testing.T, x *xdsStream) {
			x.ask(t, "client", resource.ClusterType, nil, nil)
			x.ask(t, "client", resource.EndpointType, nil, nil)
			x.ask(t, "client", other, nil, nil)
		}},
		{name: "names past MaxNamesPerStream in one request", says: "5 resource names at most", asks: func(t *testing.T, x *xdsStream) {
			x.ask(t, "client", resource.ClusterType, namesOf("c", 6), nil)
		}},
		{name: "names past MaxNamesPerStream across types", says: "5 resource names at most", asks: func(t *testing.T, x *xdsStream) {
			x.ask(t, "client", resource.ClusterType, namesOf("c", 3), nil)
			x.ask(t, "client", resource.EndpointType, namesOf("e", 3), nil)
		}},
		{name: "initial versions past MaxNamesPerStream", delta: true, says: "5 resource names at most", asks: func(t *testing.T, x *xdsStream) {
			x.ask(t, "client", resource.ClusterType, namesOf("c", 2), namesOf("held", 4))
		}},
		{name: "names subscribed one request after another", delta: true, says: "5 resource names at most", asks: func(t *testing.T, x *xdsStream) {
			x.ask(t, "client", resource.ClusterType, namesOf("c", 3), nil)
			x.ask(t, "client", resource.ClusterType, namesOf("d", 3), nil)
		}},
	}
	for _, c := range cases {
		for _, delta := range []bool{false, true} {
			if c.delta && !delta {
				continue
			}
			t.Run(fmt.Sprintf("%s, delta %v", c.name, delta), func(t *testing.T) {
				g := NewWithT(t)
				gd, conn := guardedServer(t, guard.Options{MaxTypesPerStream: 2, MaxNamesPerStream: 5})
				x := openStream(t, conn, delta)
				c.asks(t, x)
				var err error
				g.Eventually(x.ended, 10*time.Second).Should(Receive(&err))
				g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted), "%v", err)
				g.Expect(status.Convert(err).Message()).To(ContainSubstring(c.says))
				g.Expect(refusalsOf(gd.Collector())).To(Equal(map[string]float64{"limit": 1, "invalid": 0}))
			})
		}
	}
}

// What a delta stream unsubscribes from, and initial versions of names it subscribes to, are not
// counted: the stream stays within its bound.
func TestADeltaStreamsNamesAreCountedOnce(t *testing.T) {
	g := NewWithT(t)
	gd, conn := guardedServer(t, guard.Options{MaxNamesPerStream: 5})
	x := openStream(t, conn, true)
	x.ask(t, "client", resource.ClusterType, []string{"a", "c1", "c2"}, []string{"a", "c1", "c2"}) // 3
	g.Eventually(x.in, 10*time.Second).Should(Receive())
	g.Expect(x.delta.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesUnsubscribe: []string{"c1", "c2"},
		ResourceNamesSubscribe: []string{"d1", "d2", "d3"}})).To(Succeed()) // 3 - 2 + 3 = 4
	g.Expect(x.delta.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"a", "d1", "d4"}})).To(Succeed()) // 5
	g.Consistently(x.ended, 300*time.Millisecond).ShouldNot(Receive())
	g.Expect(refusalsOf(gd.Collector())["limit"]).To(BeZero())
	g.Expect(x.delta.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"d5"}})).To(Succeed()) // 6
	var err error
	g.Eventually(x.ended, 10*time.Second).Should(Receive(&err))
	g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted), "%v", err)
}

// A node may have MaxStreamsPerNode streams open at once, SotW and delta together; one more is
// refused and counted, and a stream that closes frees its place at once.
func TestANodesStreamsAreBoundedAndFreedWhenTheyClose(t *testing.T) {
	g := NewWithT(t)
	gd, conn := guardedServer(t, guard.Options{MaxStreamsPerNode: 2})
	first := openStream(t, conn, false)
	first.ask(t, "client", resource.ClusterType, nil, nil)
	g.Eventually(first.in, 10*time.Second).Should(Receive())
	second := openStream(t, conn, true)
	second.ask(t, "client", resource.ClusterType, nil, nil)
	g.Eventually(second.in, 10*time.Second).Should(Receive())

	third := openStream(t, conn, true)
	third.ask(t, "client", resource.ClusterType, nil, nil)
	var err error
	g.Eventually(third.ended, 10*time.Second).Should(Receive(&err))
	g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted), "%v", err)
	g.Expect(status.Convert(err).Message()).To(ContainSubstring(`node "client" has 2 streams open`))
	g.Expect(refusalsOf(gd.Collector())["limit"]).To(Equal(1.0))

	other := openStream(t, conn, false)
	other.ask(t, "another", resource.ClusterType, nil, nil)
	g.Consistently(other.ended, 200*time.Millisecond).ShouldNot(Receive(), "another node's streams are its own")

	first.stop()
	g.Eventually(func() int { return len(gd.Clients()) }, 10*time.Second).Should(Equal(2))
	fourth := openStream(t, conn, false)
	fourth.ask(t, "client", resource.ClusterType, nil, nil)
	g.Eventually(fourth.in, 10*time.Second).Should(Receive())
}

// kds-host's own cache serves only its types: another type URL is refused with InvalidArgument
// and counted.
func TestKDSCacheRefusesATypeItDoesNotServe(t *testing.T) {
	g := NewWithT(t)
	st, _, ins := deltaClient(t, kdsCache)
	g.Expect(st.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "client"}, TypeUrl: resource.RouteType})).To(Succeed())
	_, err := st.Recv()
	g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument), "%v", err)
	g.Expect(status.Convert(err).Message()).To(ContainSubstring("is not a kind this control plane serves"))
	g.Expect(refusalsOf(ins.Collector())).To(HaveKeyWithValue("invalid", 1.0))
}
