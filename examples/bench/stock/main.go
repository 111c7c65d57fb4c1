// Command stock is the baseline of examples/bench/scale: a stock go-control-plane v0.14 ADS
// server (pkg/server/v3: its delta and state-of-the-world servers, over pkg/cache/v3
// LinearCaches, one per kind, routed by type URL through a MuxCache) serving what a kds-host
// global serves: Mesh "default" and N MeshTimeouts, each as the same kds.v1.Resource envelope
// (built by host/kds NewEntry from the same resource list). Plaintext gRPC on loopback, no
// authentication, no store, no retries, no owner holds.
//
// With -guard it serves the same caches through the guard package (guard.New over the
// MuxCache, its defaults but NodeIndependent, its callbacks and its codec): what a
// go-control-plane server that adopts kds-host runs, over both protocols. With -floor it serves
// delta with no cache at all (floor.go): the least any server on grpc-go does for the same
// fleet, the floor under every figure.
//
//	stock -resources 1000 [-guard|-floor] [-kds-addr 127.0.0.1:0] [-cpuprofile FILE [-cpuprofile-after-sync FILE]] [-heapprofile FILE]
//
// Once it serves, it prints a benchproc.Ready line; its control endpoint changes the target
// MeshTimeout (LinearCache.UpdateResource) and reports the live heap. It stops when its standard
// input closes.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
	"github.com/kds-host/kds-host/guard"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
)

func main() {
	n := flag.Int("resources", 1000, "MeshTimeouts to serve (and Mesh \"default\")")
	addr := flag.String("kds-addr", "127.0.0.1:0", "ADS listen address (delta and state of the world)")
	wrap := flag.Bool("guard", false, "serve through guard.New over the same caches, with its defaults")
	bare := flag.Bool("floor", false, "serve delta only, with no cache: the least a grpc-go server can do for the bench's fleet (see floor.go)")
	prof := benchproc.ProfileFlags()
	flag.Parse()
	if *wrap && *bare {
		fmt.Fprintln(os.Stderr, "stock: -guard and -floor are two servers: give one")
		os.Exit(2)
	}
	if err := run(*n, *addr, *wrap, *bare, prof); err != nil {
		fmt.Fprintln(os.Stderr, "stock:", err)
		os.Exit(1)
	}
}

func run(n int, addr string, wrap, bare bool, prof *benchproc.Profiles) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := benchproc.UntilStdinCloses(ctx)
	defer cancel()

	reg := resource.Default()
	byKind := map[string]map[string]types.Resource{}
	var entries []*engine.Entry // for -floor
	for _, r := range benchproc.Resources(n) {
		if err := reg.Validate(&r); err != nil {
			return err
		}
		e, err := kds.NewEntry(&r)
		if err != nil {
			return err
		}
		if bare {
			entries = append(entries, e)
			continue
		}
		if byKind[r.Kind] == nil {
			byKind[r.Kind] = map[string]types.Resource{}
		}
		byKind[r.Kind][e.Name] = kds.ResourceOf(e)
	}
	// One LinearCache per kind: a LinearCache serves the one type URL it is given, and a kds-host
	// type URL is the kind's name. Every kind has one, so a client that subscribes another kind
	// gets an empty answer, not a closed stream.
	caches := map[string]cachev3.Cache{}
	linear := map[string]*cachev3.LinearCache{}
	for _, kind := range reg.Names() {
		lc := cachev3.NewLinearCache(kind, cachev3.WithInitialResources(byKind[kind]))
		caches[kind], linear[kind] = lc, lc
	}
	byKind = nil
	mux := &cachev3.MuxCache{
		Classify:      func(r *cachev3.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        caches,
	}

	var xdsCache cachev3.Cache = mux
	var callbacks server.Callbacks
	grpcOpts := []grpc.ServerOption{grpc.MaxRecvMsgSize(64 << 20)}
	if wrap {
		// The MuxCache chooses by type URL among LinearCaches: it answers every node alike.
		g, err := guard.New(mux, guard.Options{NodeIndependent: true})
		if err != nil {
			return err
		}
		defer g.Close()
		xdsCache, callbacks = g, g.Callbacks(nil)
		grpcOpts = append(grpcOpts, grpc.ForceServerCodecV2(g.Codec())) // what it serves every stream, encoded once
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if bare { // fixed windows, as kds-host's server has (kds.ServerWindow): no bandwidth-delay PINGs
		grpcOpts = append(grpcOpts, grpc.StaticStreamWindowSize(kds.ServerWindow), grpc.StaticConnWindowSize(kds.ServerWindow))
	}
	gs := grpc.NewServer(grpcOpts...)
	var fl *floor
	if bare {
		fl = newFloor(entries)
		entries = nil
		discovery.RegisterAggregatedDiscoveryServiceServer(gs, fl)
	} else {
		discovery.RegisterAggregatedDiscoveryServiceServer(gs, server.NewServer(ctx, xdsCache, callbacks))
	}
	served := make(chan error, 1)
	go func() { served <- gs.Serve(ln) }()

	update := func(_ context.Context, seq int) error {
		r := benchproc.Updated(seq)
		r.Generation = int64(seq) + 2 // as a store write would bump it
		if err := reg.Validate(&r); err != nil {
			return err
		}
		e, err := kds.NewEntry(&r)
		if err != nil {
			return err
		}
		if fl != nil {
			return fl.update(ctx, seq, e)
		}
		return linear[r.Kind].UpdateResource(e.Name, kds.ResourceOf(e))
	}
	control, err := benchproc.Control(ctx, prof, update)
	if err != nil {
		gs.Stop()
		return err
	}
	if err := prof.StartCPU(); err != nil {
		gs.Stop()
		return err
	}
	fmt.Println(benchproc.Ready(ln.Addr().String(), control))

	select {
	case <-ctx.Done():
	case err = <-served:
	}
	gs.Stop()
	if perr := prof.StopCPU(); err == nil {
		err = perr
	}
	return err
}
