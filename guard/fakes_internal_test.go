package guard

import (
	"context"
	"io"
	"strconv"
	"testing"
	"testing/synctest"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A guarded go-control-plane server driven without gRPC, inside a synctest bubble: each client
// is an ADS stream whose requests the test sends and whose responses it reads once the bubble
// is idle (synctest.Wait).

// guardedServer is a go-control-plane server over a SnapshotCache wrapped by a guard with opts,
// for node "client". Everything stops when the test's bubble ends.
type guardedServer struct {
	t    *testing.T
	snap cache.SnapshotCache
	g    *Guard
	srv  server.Server
	v    int
}

func newGuardedServer(t *testing.T, opts Options) *guardedServer {
	t.Helper()
	snap := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	g, err := New(snap, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		g.Close()
	})
	return &guardedServer{t: t, snap: snap, g: g, srv: server.NewServer(ctx, g, g.Callbacks(nil))}
}

// set makes the cache serve resources, by type URL, to node "client".
func (h *guardedServer) set(resources map[resource.Type][]types.Resource) {
	h.t.Helper()
	h.v++
	s, err := cache.NewSnapshot(strconv.Itoa(h.v), resources)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.snap.SetSnapshot(context.Background(), "client", s); err != nil {
		h.t.Fatal(err)
	}
}

// fakeStream is one ADS stream of the server: Req and Resp are the protocol's (SotW or delta).
type fakeStream[Req, Resp any] struct {
	grpc.ServerStream
	ctx   context.Context
	close context.CancelFunc
	reqs  chan *Req
	sent  chan *Resp
	done  chan struct{}
}

func (f *fakeStream[Req, Resp]) Context() context.Context { return f.ctx }

func (f *fakeStream[Req, Resp]) Send(r *Resp) error {
	select {
	case f.sent <- r:
		return nil
	case <-f.ctx.Done():
		return f.ctx.Err()
	}
}

func (f *fakeStream[Req, Resp]) Recv() (*Req, error) {
	select {
	case r := <-f.reqs:
		return r, nil
	case <-f.ctx.Done():
		return nil, io.EOF
	}
}

// send sends the client's request; the server reads it when the bubble runs.
func (f *fakeStream[Req, Resp]) send(r *Req) { f.reqs <- r }

// received is every response sent since it was last asked, once the bubble is idle.
func (f *fakeStream[Req, Resp]) received() []*Resp {
	synctest.Wait()
	var out []*Resp
	for {
		select {
		case r := <-f.sent:
			out = append(out, r)
		default:
			return out
		}
	}
}

// stop closes the stream, and returns once the server has closed it.
func (f *fakeStream[Req, Resp]) stop() {
	f.close()
	<-f.done
}

type deltaStream = fakeStream[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]
type sotwStream = fakeStream[discovery.DiscoveryRequest, discovery.DiscoveryResponse]

func newFakeStream[Req, Resp any](serve func(*fakeStream[Req, Resp]) error) *fakeStream[Req, Resp] {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeStream[Req, Resp]{ctx: ctx, close: cancel, reqs: make(chan *Req, 16), sent: make(chan *Resp, 1024), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		serve(f)
	}()
	return f
}

// delta opens a delta ADS stream; the test stops it (stop) or the bubble's end does.
func (h *guardedServer) delta() *deltaStream {
	f := newFakeStream(func(f *deltaStream) error { return h.srv.DeltaAggregatedResources(f) })
	h.t.Cleanup(f.stop)
	return f
}

// sotw opens a SotW ADS stream.
func (h *guardedServer) sotw() *sotwStream {
	f := newFakeStream(func(f *sotwStream) error { return h.srv.StreamAggregatedResources(f) })
	h.t.Cleanup(f.stop)
	return f
}

var clientNode = &core.Node{Id: "client"}

func eds(name string) *cluster.Cluster {
	return &cluster.Cluster{Name: name, ConnectTimeout: durationpb.New(1e9),
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS}}
}

// endpointsOf is a load assignment of cluster name with one endpoint per port.
func endpointsOf(name string, ports ...uint32) *endpoint.ClusterLoadAssignment {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name}
	var lbs []*endpoint.LbEndpoint
	for _, p := range ports {
		lbs = append(lbs, &endpoint.LbEndpoint{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
			Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
				Address: "10.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: p}}}}}}})
	}
	cla.Endpoints = []*endpoint.LocalityLbEndpoints{{LbEndpoints: lbs}}
	return cla
}

func deltaResourceNames(r *discovery.DeltaDiscoveryResponse) []string {
	var out []string
	for _, x := range r.GetResources() {
		out = append(out, x.GetName())
	}
	return out
}

// ofType are the responses of typeURL among rs.
func ofType[R interface{ GetTypeUrl() string }](rs []R, typeURL string) []R {
	var out []R
	for _, r := range rs {
		if r.GetTypeUrl() == typeURL {
			out = append(out, r)
		}
	}
	return out
}

// answerDelta ACKs every response c gets until none comes, and returns them.
func answerDelta(c *deltaStream) []*discovery.DeltaDiscoveryResponse {
	var all []*discovery.DeltaDiscoveryResponse
	for rs := c.received(); len(rs) > 0; rs = c.received() {
		for _, r := range rs {
			c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()})
		}
		all = append(all, rs...)
	}
	return all
}
