package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"syscall"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
)

// stockSettle is how long the file must be left alone before it is read: examples/xds-server's
// --resources-settle default.
const stockSettle = 100 * time.Millisecond

// oneNode is the SnapshotCache's NodeHash: every node gets the one snapshot.
type oneNode struct{}

func (oneNode) ID(*core.Node) string { return "all" }

// runStock is the stock server: go-control-plane v0.14's server over one cache of clusters
// (snapshot: a SnapshotCache, one snapshot for every node; linear: a LinearCache; mux: the
// LinearCache behind a MuxCache routing by type URL), serving the resources file
// (examples/xds-server's contract, the clusters the bench writes): read at start and once the
// file has been left alone stockSettle after a change. The admin address serves /readyz and
// /metrics (when the content served was given to the cache, as examples/xds-server names it,
// and the Go runtime's heap). It stops on SIGTERM or when its standard input closes.
func runStock(kind, file, xdsAddr, adminAddr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx, cancel := benchproc.UntilStdinCloses(ctx)
	defer cancel()
	var cache cachev3.Cache
	var set func(version int, clusters map[string]types.Resource) error
	switch kind {
	case cacheSnapshot:
		sc := cachev3.NewSnapshotCache(true, oneNode{}, nil)
		cache = sc
		set = func(version int, clusters map[string]types.Resource) error {
			list := make([]types.Resource, 0, len(clusters))
			for _, c := range clusters {
				list = append(list, c)
			}
			snap, err := cachev3.NewSnapshot(fmt.Sprint(version), map[string][]types.Resource{resource.ClusterType: list})
			if err != nil {
				return err
			}
			return sc.SetSnapshot(ctx, "all", snap)
		}
	case cacheLinear, cacheMux:
		lc := cachev3.NewLinearCache(resource.ClusterType)
		cache = lc
		if kind == cacheMux {
			cache = &cachev3.MuxCache{Classify: func(r *cachev3.Request) string { return r.GetTypeUrl() },
				ClassifyDelta: func(r *cachev3.DeltaRequest) string { return r.GetTypeUrl() },
				Caches:        map[string]cachev3.Cache{resource.ClusterType: lc}}
		}
		set = func(_ int, clusters map[string]types.Resource) error { // what changed only
			cur, update, gone := lc.GetResources(), map[string]types.Resource{}, []string(nil)
			for name, c := range clusters {
				if old, ok := cur[name]; !ok || !proto.Equal(old, c) {
					update[name] = c
				}
			}
			for name := range cur {
				if clusters[name] == nil {
					gone = append(gone, name)
				}
			}
			return lc.UpdateResources(update, gone)
		}
	default:
		return fmt.Errorf("-cache %q: want snapshot, linear or mux", kind)
	}

	var loaded atomic.Int64 // unix nanoseconds
	version, served := 0, []byte(nil)
	load := func() error {
		b, err := os.ReadFile(file)
		if err != nil || bytes.Equal(b, served) {
			return err
		}
		clusters, err := parseClusters(b)
		if err != nil {
			return err
		}
		at := time.Now()
		if err := set(version+1, clusters); err != nil {
			return err
		}
		version, served = version+1, b
		loaded.Store(at.UnixNano())
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(file)); err != nil {
		return err
	}
	if err := load(); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kds_xds_resources_file_loaded_timestamp_seconds",
		Help: "When the content served was given to the cache (Unix time)."}, func() float64 { return float64(loaded.Load()) / 1e9 }),
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })
	admin := &http.Server{Addr: adminAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	adminLn, err := net.Listen("tcp", adminAddr)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", xdsAddr)
	if err != nil {
		adminLn.Close()
		return err
	}
	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, server.NewServer(ctx, cache, nil))
	errs := make(chan error, 2)
	go func() { errs <- gs.Serve(ln) }()
	go func() { errs <- admin.Serve(adminLn) }()
	defer func() {
		gs.Stop()
		admin.Close()
		<-errs
		<-errs
	}()

	settled := time.NewTimer(time.Hour)
	settled.Stop()
	defer settled.Stop()
	abs, _ := filepath.Abs(file)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			errs <- nil // the deferred stop waits for two
			return err
		case ev := <-w.Events:
			if p, _ := filepath.Abs(ev.Name); p == abs && ev.Op != fsnotify.Chmod {
				settled.Reset(stockSettle)
			}
		case err := <-w.Errors:
			return err
		case <-settled.C:
			if err := load(); err != nil {
				fmt.Fprintln(os.Stderr, "guardfleet stock: the resources file is refused:", err)
			}
		}
	}
}

// parseClusters reads the clusters of a resources file in JSON.
func parseClusters(b []byte) (map[string]types.Resource, error) {
	var doc struct {
		Resources []json.RawMessage `json:"resources"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	out := map[string]types.Resource{}
	for i, raw := range doc.Resources {
		var a anypb.Any
		if err := protojson.Unmarshal(raw, &a); err != nil {
			return nil, fmt.Errorf("resources[%d]: %w", i, err)
		}
		m, err := a.UnmarshalNew()
		if err != nil || a.GetTypeUrl() != resource.ClusterType {
			return nil, fmt.Errorf("resources[%d]: want a cluster (%s): %v", i, a.GetTypeUrl(), err)
		}
		out[cachev3.GetResourceName(m)] = m
	}
	return out, nil
}
