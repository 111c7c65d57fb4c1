package guard_test

import (
	"context"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/guard"
	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/internal/xdstest"
)

// TestMain removes the binaries the tests built, and checks for leaked
// goroutines.
func TestMain(m *testing.M) {
	code := m.Run()
	xdstest.RemoveBuiltClient()
	testbin.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// sotw is a go-control-plane SotW ADS server on loopback over a SnapshotCache, guarded or not,
// and one raw ADS stream to it.
type sotw struct {
	t      *testing.T
	snap   cache.SnapshotCache
	guard  *guard.Guard
	stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	in     chan *discovery.DiscoveryResponse
	v      int
}

func newSotw(t *testing.T, guarded bool) *sotw {
	t.Helper()
	if guarded {
		return newSotwWith(t, &guard.Options{})
	}
	return newSotwWith(t, nil)
}

// newSotwWith is newSotw guarded with opts (nil: stock).
func newSotwWith(t *testing.T, opts *guard.Options) *sotw {
	t.Helper()
	h := &sotw{t: t, snap: cache.NewSnapshotCache(true, cache.IDHash{}, nil)}
	ctx, cancel := context.WithCancel(context.Background())
	var c cache.Cache = h.snap
	var cb server.Callbacks
	if opts != nil {
		g, err := guard.New(h.snap, *opts)
		if err != nil {
			t.Fatal(err)
		}
		h.guard, c, cb = g, g, g.Callbacks(nil)
	}
	conn := serve(t, ctx, c, cb)
	sctx, scancel := context.WithCancel(ctx)
	var err error
	h.stream, err = discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	h.in = make(chan *discovery.DiscoveryResponse, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			r, err := h.stream.Recv()
			if err != nil {
				return
			}
			h.in <- r
		}
	}()
	t.Cleanup(func() {
		scancel()
		<-done
		cancel()
		if h.guard != nil {
			h.guard.Close()
		}
	})
	return h
}

// serve serves a go-control-plane server over c with cb (ADS and the per-type services) on
// loopback until the test ends, with the gRPC server's options, and returns a connection to it.
func serve(t *testing.T, ctx context.Context, c cache.Cache, cb server.Callbacks, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	srv := server.NewServer(ctx, c, cb)
	gs := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	clusterservice.RegisterClusterDiscoveryServiceServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
	})
	return conn
}

func edsCluster(name string, lb cluster.Cluster_LbPolicy) types.Resource {
	return &cluster.Cluster{Name: name, ConnectTimeout: durationpb.New(time.Second), LbPolicy: lb,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS}}
}

func (h *sotw) set(clusters ...types.Resource) {
	h.t.Helper()
	h.v++
	s, err := cache.NewSnapshot(strconv.Itoa(h.v), map[resource.Type][]types.Resource{resource.ClusterType: clusters})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.snap.SetSnapshot(context.Background(), "client", s); err != nil {
		h.t.Fatal(err)
	}
}

func (h *sotw) send(req *discovery.DiscoveryRequest) {
	h.t.Helper()
	req.TypeUrl = resource.ClusterType
	if req.Node == nil {
		req.Node = nodeOf("client")
	}
	if err := h.stream.Send(req); err != nil {
		h.t.Fatal(err)
	}
}

// next is the next response, within a second.
func (h *sotw) next() *discovery.DiscoveryResponse {
	h.t.Helper()
	select {
	case r := <-h.in:
		return r
	case <-time.After(5 * time.Second):
		h.t.Fatal("no response")
		return nil
	}
}

func names(r *discovery.DiscoveryResponse) []string {
	var out []string
	for _, a := range r.GetResources() {
		var c cluster.Cluster
		if err := a.UnmarshalTo(&c); err == nil {
			out = append(out, c.GetName())
		}
	}
	slices.Sort(out)
	return out
}

// nackB answers r as grpc-go does when it refuses cluster "b".
func (h *sotw) nackB(r *discovery.DiscoveryResponse, ackedVersion string) {
	h.send(&discovery.DiscoveryRequest{VersionInfo: ackedVersion, ResponseNonce: r.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: 3, Message: `error parsing "ClusterResource" response: resource "b": unsupported lb policy MAGLEV`}})
}

func (h *sotw) ack(r *discovery.DiscoveryResponse) {
	h.send(&discovery.DiscoveryRequest{VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})
}

// A client that refuses a cluster, as grpc-go does (it names it in its message): the stock server
// sends the refused cluster again after every NACK, as fast as the client answers; the guard sends
// the client what it can take, tries the refused version again the policy's attempts, then parks
// it, and a change of another cluster still reaches the client.
func TestARefusedClusterIsTriedThePolicysAttemptsThenWithheld(t *testing.T) {
	t.Run("stock", func(t *testing.T) {
		g := NewWithT(t)
		h := newSotw(t, false)
		h.set(edsCluster("a", cluster.Cluster_ROUND_ROBIN), edsCluster("b", cluster.Cluster_MAGLEV))
		h.send(&discovery.DiscoveryRequest{})
		nacks := 0
		for r := h.next(); nacks < 50; r = h.next() {
			g.Expect(names(r)).To(ContainElement("b"))
			h.nackB(r, "")
			nacks++
		}
		// The point of the baseline: 50 NACKs and the server still sends "b".
		g.Expect(nacks).To(Equal(50))
	})
	t.Run("guarded", func(t *testing.T) {
		g := NewWithT(t)
		h := newSotw(t, true)
		h.set(edsCluster("a", cluster.Cluster_ROUND_ROBIN), edsCluster("b", cluster.Cluster_MAGLEV))
		h.send(&discovery.DiscoveryRequest{})
		r := h.next()
		g.Expect(names(r)).To(Equal([]string{"a", "b"}))
		h.nackB(r, "")
		nacks, acked := 1, ""
		deadline := time.After(3 * time.Second) // backoff 100ms, 200ms, ... with full jitter: three tries fit well within
		for done := false; !done; {
			select {
			case r := <-h.in:
				if slices.Contains(names(r), "b") {
					h.nackB(r, acked)
					nacks++
				} else {
					g.Expect(names(r)).To(Equal([]string{"a"}), "what the client can take")
					acked = r.GetVersionInfo()
					h.ack(r)
				}
			case <-deadline:
				done = true
			}
		}
		g.Expect(nacks).To(Equal(3), "the built-in policy's invalidAttempts")
		clients := h.guard.Clients()
		g.Expect(clients).To(HaveLen(1))
		var withheld []guard.Withheld
		for _, ti := range clients[0].Types {
			withheld = append(withheld, ti.Withheld...)
		}
		g.Expect(withheld).To(ConsistOf(HaveField("Name", "b")))
		g.Expect(withheld[0].Reason).To(ContainSubstring("unsupported lb policy MAGLEV"))

		// Another cluster's change reaches the client; "b" stays out.
		h.set(edsCluster("a", cluster.Cluster_LEAST_REQUEST), edsCluster("b", cluster.Cluster_MAGLEV))
		r = h.next()
		g.Expect(names(r)).To(Equal([]string{"a"}))
		var a cluster.Cluster
		g.Expect(r.GetResources()[0].UnmarshalTo(&a)).To(Succeed())
		g.Expect(a.GetLbPolicy()).To(Equal(cluster.Cluster_LEAST_REQUEST))
		h.ack(r)

		// New content of "b" is sent, and accepted.
		h.set(edsCluster("a", cluster.Cluster_LEAST_REQUEST), edsCluster("b", cluster.Cluster_ROUND_ROBIN))
		r = h.next()
		g.Expect(names(r)).To(Equal([]string{"a", "b"}))
		h.ack(r)
		g.Consistently(h.in, 300*time.Millisecond).ShouldNot(Receive())
	})
}

func nodeOf(id string) *core.Node { return &core.Node{Id: id} }

// countingCache counts the watches made of the cache it wraps.
type countingCache struct {
	cache.Cache
	watches atomic.Int64
}

func (c *countingCache) CreateWatch(req *discovery.DiscoveryRequest, sub cache.Subscription, out chan cache.Response) (func(), error) {
	c.watches.Add(1)
	return c.Cache.CreateWatch(req, sub, out)
}

// The guard's own watch of the wrapped cache waits for the next version: a SnapshotCache that
// compares what a watch says it was returned with what it serves must not be made to answer again
// and again (before the fix: a watch a few microseconds, a core of CPU, with nothing changing).
func TestTheGuardWatchesTheWrappedCacheOnceAVersion(t *testing.T) {
	g := NewWithT(t)
	h := newSotw(t, false)
	counting := &countingCache{Cache: h.snap}
	gd, err := guard.New(counting, guard.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	cb := gd.Callbacks(nil)
	g.Expect(cb.OnStreamOpen(context.Background(), 1, resource.ClusterType)).To(Succeed())
	defer cb.OnStreamClosed(1, nil)
	h.set(edsCluster("a", cluster.Cluster_ROUND_ROBIN))
	req := &discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: resource.ClusterType}
	g.Expect(cb.OnStreamRequest(1, req)).To(Succeed())
	out := make(chan cache.Response, 1)
	cancel, err := gd.CreateWatch(req, stream.NewSotwSubscription(nil, true), out)
	g.Expect(err).NotTo(HaveOccurred())
	defer cancel()
	g.Eventually(out).Should(Receive())
	time.Sleep(200 * time.Millisecond)
	g.Expect(counting.watches.Load()).To(BeNumerically("<=", 2), "one watch for the first version, one waiting for the next")
	h.set(edsCluster("a", cluster.Cluster_LEAST_REQUEST))
	g.Eventually(counting.watches.Load).Should(BeNumerically("==", 3))
	time.Sleep(200 * time.Millisecond)
	g.Expect(counting.watches.Load()).To(BeNumerically("==", 3))
}

// muxOf is a MuxCache over clusters, chosen by type URL, as a server with one cache per type has
// it.
func muxOf(clusters *cache.LinearCache) *cache.MuxCache {
	return &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        map[string]cache.Cache{resource.ClusterType: clusters},
	}
}

// The guard wraps any cache.Cache: a MuxCache of LinearCaches, as a server with one cache per
// type has it, behaves as a SnapshotCache does.
func TestTheGuardWrapsLinearCachesInAMuxCache(t *testing.T) {
	g := NewWithT(t)
	clusters := cache.NewLinearCache(resource.ClusterType)
	gd, err := guard.New(muxOf(clusters), guard.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, gd, gd.Callbacks(nil))).StreamAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(clusters.UpdateResource("a", edsCluster("a", cluster.Cluster_ROUND_ROBIN))).To(Succeed())
	g.Expect(clusters.UpdateResource("b", edsCluster("b", cluster.Cluster_MAGLEV))).To(Succeed())
	g.Expect(st.Send(&discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: resource.ClusterType})).To(Succeed())
	r, err := st.Recv()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(names(r)).To(Equal([]string{"a", "b"}))
	// The client keeps a and refuses b (as grpc-go and Envoy take a Cluster response): the next
	// response it can take is a's update, without b.
	g.Expect(st.Send(&discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: 3, Message: `error parsing "ClusterResource" response: resource "b": unsupported`}})).To(Succeed())

	g.Expect(clusters.UpdateResource("a", edsCluster("a", cluster.Cluster_LEAST_REQUEST))).To(Succeed())
	for {
		r, err = st.Recv()
		g.Expect(err).NotTo(HaveOccurred())
		if !slices.Contains(names(r), "b") { // a retry round may resend b meanwhile
			break
		}
		g.Expect(st.Send(&discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce(),
			ErrorDetail: &rpcstatus.Status{Code: 3, Message: `resource "b": unsupported`}})).To(Succeed())
	}
	var a cluster.Cluster
	g.Expect(r.GetResources()[0].UnmarshalTo(&a)).To(Succeed())
	g.Expect(a.GetLbPolicy()).To(Equal(cluster.Cluster_LEAST_REQUEST))
}

// A client cannot make the guard watch the wrapped cache without bound: a stream may ask for
// MaxTypesPerStream types at most, and a NACK's message is read and kept bounded.
func TestAStreamsTypesAndNACKMessagesAreBounded(t *testing.T) {
	g := NewWithT(t)
	gd, err := guard.New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), guard.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	cb := gd.Callbacks(nil)
	g.Expect(cb.OnStreamOpen(context.Background(), 1, "")).To(Succeed())
	defer cb.OnStreamClosed(1, nil)
	out := make(chan cache.Response, 100)
	var refused error
	for i := range 40 {
		req := &discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: "type.googleapis.com/made.up.T" + strconv.Itoa(i)}
		if refused = cb.OnStreamRequest(1, req); refused != nil {
			break
		}
		cancel, err := gd.CreateWatch(req, stream.NewSotwSubscription(nil, true), out)
		g.Expect(err).NotTo(HaveOccurred())
		defer cancel()
	}
	g.Expect(refused).To(MatchError(ContainSubstring("32 types at most")))

	// A NACK of a response that was never sent changes nothing, and creates no type.
	huge := strings.Repeat("x", 1<<20)
	g.Expect(cb.OnStreamOpen(context.Background(), 2, "")).To(Succeed())
	defer cb.OnStreamClosed(2, nil)
	g.Expect(cb.OnStreamRequest(2, &discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: "type.googleapis.com/other", ResponseNonce: "7",
		ErrorDetail: &rpcstatus.Status{Message: huge}})).To(Succeed())
	g.Expect(gd.Clients()).To(HaveLen(2))
	g.Expect(gd.Clients()[1].Types).To(BeEmpty())
}

func TestAHugeNACKMessageIsKeptBounded(t *testing.T) {
	g := NewWithT(t)
	h := newSotw(t, true)
	h.set(edsCluster("a", cluster.Cluster_ROUND_ROBIN))
	h.send(&discovery.DiscoveryRequest{})
	r := h.next()
	h.send(&discovery.DiscoveryRequest{ResponseNonce: r.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: 3, Message: `resource "a": ` + strings.Repeat("x", 1<<20)}})
	g.Eventually(func() int64 { return h.guard.Clients()[0].Types[0].NACKs }).Should(Equal(int64(1)))
	ti := h.guard.Clients()[0].Types[0]
	g.Expect(len(ti.LastError)).To(BeNumerically("<=", 4<<10+3))
	g.Expect(ti.LastError).To(HavePrefix(`resource "a": xxx`))
}

// The per-type SotW services (here CDS's StreamClusters) are guarded as ADS is.
func TestThePerTypeServicesAreGuarded(t *testing.T) {
	g := NewWithT(t)
	snap := cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	gd, err := guard.New(snap, guard.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := clusterservice.NewClusterDiscoveryServiceClient(serve(t, ctx, gd, gd.Callbacks(nil))).StreamClusters(ctx)
	g.Expect(err).NotTo(HaveOccurred())

	s, err := cache.NewSnapshot("1", map[resource.Type][]types.Resource{resource.ClusterType: {
		edsCluster("a", cluster.Cluster_ROUND_ROBIN), edsCluster("b", cluster.Cluster_MAGLEV)}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(snap.SetSnapshot(ctx, "client", s)).To(Succeed())
	in := make(chan *discovery.DiscoveryResponse, 16)
	go func() {
		defer close(in)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			in <- r
		}
	}()
	g.Expect(st.Send(&discovery.DiscoveryRequest{Node: nodeOf("client")})).To(Succeed())
	var r *discovery.DiscoveryResponse
	g.Eventually(in, 10*time.Second).Should(Receive(&r))
	g.Expect(names(r)).To(Equal([]string{"a", "b"}))
	// The client keeps a and refuses b, each time it is sent (the policy's attempts), until the
	// guard stops sending it.
	nacks := 0
	for slices.Contains(names(r), "b") && nacks < 10 {
		g.Expect(st.Send(&discovery.DiscoveryRequest{Node: nodeOf("client"), ResponseNonce: r.GetNonce(),
			ErrorDetail: &rpcstatus.Status{Code: 3, Message: `resource "b": unsupported`}})).To(Succeed())
		nacks++
		select {
		case r = <-in:
		case <-time.After(5 * time.Second):
			r = nil
		}
	}
	g.Expect(nacks).To(BeNumerically("<=", 3), "the policy's attempts, not a storm")
	// What the client can take: a's next version, without b.
	s, err = cache.NewSnapshot("2", map[resource.Type][]types.Resource{resource.ClusterType: {
		edsCluster("a", cluster.Cluster_LEAST_REQUEST), edsCluster("b", cluster.Cluster_MAGLEV)}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(snap.SetSnapshot(ctx, "client", s)).To(Succeed())
	g.Eventually(in, 10*time.Second).Should(Receive(&r))
	g.Expect(names(r)).To(Equal([]string{"a"}), "what the client can take")
	g.Expect(gd.Clients()).To(ConsistOf(HaveField("Types", ConsistOf(HaveField("TypeURL", resource.ClusterType)))))
}
