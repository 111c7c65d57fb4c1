package guard_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kds-host/kds-host/guard"
	"github.com/kds-host/kds-host/policy"
)

// Adopting the guard in an existing go-control-plane server: wrap its cache, and give the server
// the guard's callbacks (composed with its own, here none).
func Example() {
	snapshots := cache.NewSnapshotCache(true, cache.IDHash{}, nil) // the server's own cache

	g, err := guard.New(snapshots, guard.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	xds := server.NewServer(context.Background(), g, g.Callbacks(nil))

	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, xds)
	// ... gs.Serve(listener), and snapshots.SetSnapshot(...) as before: nothing else changes.
	fmt.Println("clients:", len(g.Clients()))
	// Output: clients: 0
}

// Guarding a SnapshotCache server with the reference retry-forcer plugin (built with
// `go build ./plugins/retry-forcer`), pinned by its checksum and configured by its policy
// document: the guard starts, supervises and stops it. Nothing of kds-host's application is
// imported: the guard, and the policy package's Plugin.
func Example_plugin() {
	snapshots := cache.NewSnapshotCache(true, cache.IDHash{}, nil) // the server's own cache
	g, err := guard.New(snapshots, guard.Options{Plugins: []policy.Plugin{{
		Path:   "./bin/retry-forcer",
		SHA256: "c0ffee...", // sha256sum ./bin/retry-forcer; empty runs whatever is at Path
		Config: []byte("policy: exponential\nbase: 100ms\nmax: 30s\n"),
	}}})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	xds := server.NewServer(context.Background(), g, g.Callbacks(nil))
	gs := grpc.NewServer(grpc.ForceServerCodecV2(g.Codec()))
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, xds)
	// ... gs.Serve(listener), and snapshots.SetSnapshot(...) as before.
}

// A server with a cache per type (a MuxCache of LinearCaches, chosen by type URL) answers every
// node alike, and the guard sees it: it keeps one watch of it per type for every stream, and its
// codec writes what they are all served from one encoding of it.
func ExampleGuard_Codec() {
	clusters := cache.NewLinearCache(resource.ClusterType)
	mux := &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        map[string]cache.Cache{resource.ClusterType: clusters},
	}

	g, err := guard.New(mux, guard.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	xds := server.NewServer(context.Background(), g, g.Callbacks(nil))

	gs := grpc.NewServer(grpc.ForceServerCodecV2(g.Codec())) // with the server's other options
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, xds)
	// ... gs.Serve(listener), and clusters.UpdateResource(...) as before.
	fmt.Println(g.Codec().Name())
	// Output: proto
}

// The guard composes with the server's own callbacks, and its insight mounts in the server's
// own admin listener: a JSON handler and a Prometheus collector.
func Example_insight() {
	snapshots := cache.NewSnapshotCache(true, cache.IDHash{}, nil)
	g, err := guard.New(snapshots, guard.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	mine := server.CallbackFuncs{
		StreamRequestFunc: func(id int64, req *discovery.DiscoveryRequest) error {
			if req.GetNode().GetId() == "" {
				return fmt.Errorf("stream %d: a node id is required", id)
			}
			return nil
		},
	}
	_ = server.NewServer(context.Background(), g, g.Callbacks(&mine))

	// What the callbacks see, as the server would call them.
	cb := g.Callbacks(&mine)
	fmt.Println(cb.OnStreamRequest(1, &discovery.DiscoveryRequest{Node: &core.Node{}}))

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(g.Collector())
	families, _ := reg.Gather()
	for _, f := range families {
		fmt.Println(f.GetName(), f.GetMetric()[0].GetGauge().GetValue())
	}

	rec := httptest.NewRecorder()
	g.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/clients", nil))
	body, _ := io.ReadAll(rec.Body)
	fmt.Println(rec.Code, strings.TrimSpace(string(body)))
	// Output:
	// stream 1: a node id is required
	// xds_guard_clients 0
	// xds_guard_refusals_total 0
	// 200 {"items":[],"total":0}
}

// A server that keeps its resources itself serves them from kds-host's cache instead of a
// go-control-plane one, for delta and state-of-the-world clients; the same options and insight.
func ExampleNewCache() {
	c, err := guard.NewCache([]string{resource.ClusterType, resource.EndpointType}, guard.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	xds := server.NewServer(context.Background(), c, c.Callbacks(nil))
	gs := grpc.NewServer(grpc.ForceServerCodecV2(c.Codec())) // each version encoded once, for every client
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, xds)

	// Every resource of every type, each time: a client is sent what changed.
	err = c.SetResources(map[string][]types.Resource{
		resource.ClusterType: {&cluster.Cluster{Name: "backend"}},
	})
	fmt.Println(err, len(c.Clients()))
	// Output: <nil> 0
}
