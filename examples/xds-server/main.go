// Command xds-server is a small Envoy-types xDS server on kds-host's guard: it serves the Envoy
// v3 resources of one file (re-read when it changes) to every client, SotW and delta, with the
// guard's NACK handling in front of go-control-plane's SnapshotCache, or (--guard=false) through
// the stock go-control-plane path, so one binary shows both sides. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	secretservice "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	gcplog "github.com/envoyproxy/go-control-plane/pkg/log"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/kds-host/kds-host/guard"
	"github.com/kds-host/kds-host/internal/hclogslog"
	"github.com/kds-host/kds-host/policy"
	"github.com/kds-host/kds-host/shared"
)

// envPrefix names a flag's environment twin: KDS_XDS_SERVER_ + the flag upper-cased, - as _.
const envPrefix = "KDS_XDS_SERVER_"

// stopTimeout bounds the graceful stop of the gRPC server before it is stopped hard.
const stopTimeout = 5 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Environ()); err != nil {
		fmt.Fprintln(os.Stderr, "xds-server:", err)
		os.Exit(1)
	}
}

// run runs the server until ctx ends. args are the command-line arguments (without the program
// name), env the environment (os.Environ's form) the flags' twins are read from.
func run(ctx context.Context, args, env []string) error {
	return runWith(ctx, args, env, hooks{})
}

// hooks let a test see inside a run.
type hooks struct {
	logOut io.Writer                   // logs (default stderr)
	ready  func(xdsAddr, admin string) // called once both listeners serve
}

type config struct {
	xdsAddr, adminAddr string
	resources          string
	allowEmpty         bool
	maxResourcesBytes  int64
	resourcesSettle    time.Duration
	resourcesReread    time.Duration
	plugins            []string
	pluginConfigs      []string
	ownerHolds         bool
	guard              bool
	cacheKind          string // --cache
	maxStreams         int64
	maxStreamsPerConn  uint32
	maxReceiveMessage  int
	maxTypesPerStream  int
	maxNamesPerStream  int
	maxStreamsPerNode  int
	tlsCert, tlsKey    string
	tlsClientCA        string
	logLevel           string
}

func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func newFlags(cfg *config) *pflag.FlagSet {
	f := pflag.NewFlagSet("xds-server", pflag.ContinueOnError)
	f.SortFlags = false
	f.SetOutput(io.Discard) // run reports errors and prints --help itself
	f.Usage = func() {}
	f.StringVar(&cfg.xdsAddr, "xds-addr", "127.0.0.1:18000", "xDS gRPC listener: ADS (SotW and delta) and the LDS, RDS, CDS, EDS and SDS services. "+
		"Plaintext without --tls-cert, unauthenticated without --tls-client-ca: anyone who reaches it gets every resource. Loopback by default; "+
		"on any other address, use TLS and client certificates or put it behind your own network policy")
	f.StringVar(&cfg.resources, "resources", "", "YAML or JSON file whose resources: list holds Envoy v3 resources "+
		"(protobuf JSON of an Any, with its \"@type\"), served to every node; re-read when it changes, and a read that is empty, "+
		"has no resources or does not parse is refused (the last good resources stay served). Write it elsewhere and rename it into place (required)")
	f.BoolVar(&cfg.allowEmpty, "allow-empty", false, "serve a file with no resources (an empty file, {}, resources: null or resources: []) "+
		"as an empty set, removing every resource from every client, with a WARN; without it such a file is refused")
	f.Int64Var(&cfg.maxResourcesBytes, "max-resources-bytes", 16<<20, "bytes of the resources file at most; a larger file is refused")
	f.DurationVar(&cfg.resourcesSettle, "resources-settle", 100*time.Millisecond, "how long the resources file must be left alone after a change "+
		"before it is read (a write in several steps within it is read once, whole)")
	f.DurationVar(&cfg.resourcesReread, "resources-reread", 10*time.Second, "re-read the resources file this often whatever the file watch says "+
		"(filesystems without inotify, such as NFS, and lost events); 0: never")
	f.StringVar(&cfg.adminAddr, "admin-addr", "127.0.0.1:19000", "admin HTTP listener: /metrics, /healthz, /readyz (503 while the resources file is refused), /clients (node ids and refusal messages). "+
		"Plaintext, no authentication: loopback by default; keep it where the operators are")
	f.StringSliceVar(&cfg.plugins, "plugin", nil, "retry plugin binary, PATH or PATH@sha256:HEX to pin its checksum, or builtin (repeatable); "+
		"the guard asks it at every decision. Without it: the guard's built-in policy")
	f.StringSliceVar(&cfg.pluginConfigs, "plugin-config", nil, "policy document for the plugins: FILE (every --plugin, or the built-in policy without --plugin), "+
		"or NAME=FILE for plugin NAME (its Describe name, its binary's file name, or builtin), as kds-host (repeatable)")
	f.BoolVar(&cfg.ownerHolds, "owner-holds", true, "guard: hold a resource until the client has what it references, and ask the owner check (the --plugin runtime's) before a version goes out (false: neither)")
	f.BoolVar(&cfg.guard, "guard", true, "serve through kds-host's guard; false: the stock go-control-plane path (the SnapshotCache as the server's cache)")
	f.StringVar(&cfg.cacheKind, "cache", cacheSnapshot, "what the server serves from: snapshot (a go-control-plane SnapshotCache, one snapshot for every node, "+
		"wrapped by guard.New told its node hash: one watch of it for every stream, and the guard's codec); linear (a LinearCache per type, each given what changed of the file, behind a MuxCache "+
		"that routes by type URL; guard.New over it with NodeIndependent, one watch per type shared by every stream, and the guard's codec); "+
		"mux (the same MuxCache given to guard.New as it is, with its defaults: a MuxCache of LinearCaches, so one watch per type shared by every stream as well; and the codec); "+
		"or kds (kds-host's own cache, guard.NewCache: the same holds, a write costing only what changed; guard only). "+
		"With --guard=false, snapshot serves the SnapshotCache and linear and mux the MuxCache, through the stock server")
	f.Int64Var(&cfg.maxStreams, "max-streams", 10000, "xDS streams open at once, all connections together; one more is refused with RESOURCE_EXHAUSTED (0: no bound)")
	f.Uint32Var(&cfg.maxStreamsPerConn, "max-streams-per-connection", 16, "xDS streams one connection may have open (HTTP/2 MAX_CONCURRENT_STREAMS)")
	f.IntVar(&cfg.maxReceiveMessage, "max-receive-message", 4<<20, "bytes of one xDS request at most; a larger one ends its stream with RESOURCE_EXHAUSTED")
	f.IntVar(&cfg.maxTypesPerStream, "max-types-per-stream", guard.DefaultMaxTypesPerStream, "guard: type URLs one stream may ask for; a request past it is refused with RESOURCE_EXHAUSTED and counted in kds_xds_refusals_total")
	f.IntVar(&cfg.maxNamesPerStream, "max-names-per-stream", guard.DefaultMaxNamesPerStream, "guard: resource names one stream may ask for across its types (subscribed, or a delta type's initial versions); past it, RESOURCE_EXHAUSTED, counted")
	f.IntVar(&cfg.maxStreamsPerNode, "max-streams-per-node", guard.DefaultMaxStreamsPerNode, "guard: streams open at once with one node id; one more is refused with RESOURCE_EXHAUSTED, counted (negative: no bound)")
	f.StringVar(&cfg.tlsCert, "tls-cert", "", "xDS listener: TLS certificate file (PEM); without it the listener is plaintext")
	f.StringVar(&cfg.tlsKey, "tls-key", "", "xDS listener: the private key file of --tls-cert (PEM)")
	f.StringVar(&cfg.tlsClientCA, "tls-client-ca", "", "xDS listener: CA file (PEM); a client must present a certificate it signed (mutual TLS: the only authentication this server has)")
	f.StringVar(&cfg.logLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	f.VisitAll(func(fl *pflag.Flag) {
		fl.Usage += fmt.Sprintf(" [env %s]", envName(fl.Name))
	})
	return f
}

// parse reads args, then the environment twins of the flags args did not set.
func parse(args, env []string) (config, *pflag.FlagSet, error) {
	var cfg config
	f := newFlags(&cfg)
	if err := f.Parse(args); err != nil {
		return cfg, f, err
	}
	if f.NArg() > 0 {
		return cfg, f, fmt.Errorf("unexpected arguments: %q", f.Args())
	}
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	var err error
	f.VisitAll(func(fl *pflag.Flag) {
		v, ok := vars[envName(fl.Name)]
		if !ok || fl.Changed || err != nil {
			return
		}
		if e := f.Set(fl.Name, v); e != nil {
			err = fmt.Errorf("%s=%q: %w", envName(fl.Name), v, e)
		}
	})
	if err != nil {
		return cfg, f, err
	}
	if cfg.resources == "" {
		return cfg, f, fmt.Errorf("--resources FILE is required (or %s)", envName("resources"))
	}
	switch {
	case cfg.maxResourcesBytes <= 0:
		return cfg, f, fmt.Errorf("--max-resources-bytes %d: want a positive number of bytes", cfg.maxResourcesBytes)
	case cfg.resourcesSettle < 0:
		return cfg, f, fmt.Errorf("--resources-settle %s: want 0 or more", cfg.resourcesSettle)
	case cfg.resourcesReread < 0:
		return cfg, f, fmt.Errorf("--resources-reread %s: want 0 (never) or more", cfg.resourcesReread)
	case cfg.maxStreams < 0:
		return cfg, f, fmt.Errorf("--max-streams %d: want 0 (no bound) or more", cfg.maxStreams)
	case cfg.maxStreamsPerConn == 0:
		return cfg, f, errors.New("--max-streams-per-connection 0: want 1 or more")
	case cfg.maxReceiveMessage <= 0:
		return cfg, f, fmt.Errorf("--max-receive-message %d: want a positive number of bytes", cfg.maxReceiveMessage)
	case cfg.maxTypesPerStream <= 0:
		return cfg, f, fmt.Errorf("--max-types-per-stream %d: want 1 or more", cfg.maxTypesPerStream)
	case cfg.maxNamesPerStream <= 0:
		return cfg, f, fmt.Errorf("--max-names-per-stream %d: want 1 or more", cfg.maxNamesPerStream)
	case cfg.maxStreamsPerNode == 0:
		return cfg, f, errors.New("--max-streams-per-node 0: want 1 or more, or negative for no bound")
	}
	return cfg, f, nil
}

func usage(w io.Writer, f *pflag.FlagSet) {
	fmt.Fprintf(w, `xds-server: serves the Envoy v3 resources of one file to every xDS client, through kds-host's guard.

Usage: xds-server --resources FILE [flags]

Both listeners are plaintext and unauthenticated by default, for loopback demos: anyone who
reaches --xds-addr gets every resource; anyone who reaches --admin-addr sees node ids and
refusal messages. --tls-cert and --tls-key put the xDS listener under TLS, --tls-client-ca asks
its clients for a certificate; the admin listener stays plaintext. On any other address than
loopback, use them, and keep --admin-addr behind your own network policy.

Write the resources file elsewhere and rename it into place: a file read while half written
that still parses cannot be told from a smaller one.

Flags (each also read from its environment variable, shown in brackets; a flag wins):
%s`, f.FlagUsages())
}

func runWith(ctx context.Context, args, env []string, h hooks) error {
	cfg, f, err := parse(args, env)
	if errors.Is(err, pflag.ErrHelp) {
		usage(os.Stdout, f)
		return nil
	}
	if err != nil {
		return err
	}
	out := h.logOut
	if out == nil {
		out = os.Stderr
	}
	level := hclog.LevelFromString(cfg.logLevel)
	if level == hclog.NoLevel {
		return fmt.Errorf("--log-level %q: want trace, debug, info, warn or error", cfg.logLevel)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "xds-server", Level: level, Output: out})

	if !slices.Contains(cacheKinds, cfg.cacheKind) {
		return fmt.Errorf("--cache %q: want %s", cfg.cacheKind, strings.Join(cacheKinds, ", "))
	}
	if cfg.cacheKind == cacheKDS && !cfg.guard {
		return fmt.Errorf("--cache %s serves through the guard: it cannot be used with --guard=false", cacheKDS)
	}
	// The resources, before anything listens: a bad file at start is an error. The file's watch
	// is in place first, so a change after the first read is seen.
	var (
		snapshots cache.SnapshotCache // --cache snapshot
		linear    *linearCaches       // --cache linear and mux
		set       func(context.Context, string, map[string][]types.Resource) error
	)
	switch cfg.cacheKind {
	case cacheSnapshot:
		snapshots = cache.NewSnapshotCache(true, allNodes{}, cacheLogger(log.Named("cache")))
		set = snapshotSetter(snapshots)
	case cacheLinear, cacheMux:
		linear = newLinearCaches(log.Named("cache"))
		set = linear.set
	}
	var (
		opts guard.Options
		rt   *policy.Runtime // --plugin's
		own  *guard.Cache    // --cache kds
	)
	if cfg.guard {
		var err error
		if opts, rt, err = pluginOptions(cfg, log); err != nil {
			return err
		}
		if rt != nil {
			defer rt.Close()
		}
	}
	if cfg.cacheKind == cacheKDS {
		var err error
		if own, err = guard.NewCache(kdsCacheTypes, opts); err != nil {
			return err
		}
		defer own.Close()
		set = func(_ context.Context, _ string, res map[string][]types.Resource) error { return own.SetResources(res) }
	}
	src := newSource(cfg.resources, cfg.maxResourcesBytes, cfg.allowEmpty, set, log)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	fol := newFollower(cfg.resources, cfg.resourcesSettle, cfg.resourcesReread, func() { src.reload(watchCtx) }, log.Named("resources"))
	defer fol.close()
	if err := src.start(ctx); err != nil {
		return fmt.Errorf("--resources %s: %w", cfg.resources, err)
	}
	streams := &streamLimit{max: cfg.maxStreams}
	grpcOpts, err := serverOptions(cfg, streams)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(src, streams, goCollector())
	var (
		xdsCache  cache.Cache = snapshots
		callbacks server.Callbacks
		clients   http.Handler
	)
	if linear != nil {
		xdsCache = linear.mux
	}
	if rt != nil {
		reg.MustRegister(rt.Collectors()...)
	}
	switch {
	case own != nil:
		xdsCache, callbacks, clients = own, own.Callbacks(nil), own.Handler()
		reg.MustRegister(own.Collector())
	case cfg.guard:
		// --cache linear: the MuxCache answers every node alike, and the guard is told so (mux:
		// not told, the guard sees a MuxCache of LinearCaches and shares its watches the same);
		// --cache snapshot: the SnapshotCache's node hash, so one watch of it serves every stream.
		switch cfg.cacheKind {
		case cacheLinear:
			opts.NodeIndependent = true
		case cacheSnapshot:
			opts.NodeHash = allNodes{}
		}
		g, err := guard.New(xdsCache, opts)
		if err != nil {
			return err
		}
		defer g.Close()
		xdsCache, callbacks, clients = g, g.Callbacks(nil), g.Handler()
		reg.MustRegister(g.Collector())
		// What the streams that share a snapshot are served of a type, encoded once.
		grpcOpts = append(grpcOpts, grpc.ForceServerCodecV2(g.Codec()))
	default:
		if len(cfg.plugins) > 0 || len(cfg.pluginConfigs) > 0 {
			log.Warn("--guard=false: --plugin and --plugin-config are not used (the stock path has no retry policy)")
		}
		if f.Changed("owner-holds") {
			log.Warn("--guard=false: --owner-holds is not used")
		}
		c := newStockCounters(log.Named("stock"))
		reg.MustRegister(c)
		callbacks = c
		clients = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "the guard is off (--guard=false): no client insight; /metrics counts responses and NACKs", http.StatusNotFound)
		})
	}

	// The admin listener.
	var serving atomic.Bool
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/healthz", src.healthz(serving.Load))
	mux.Handle("/readyz", src.readyz(serving.Load))
	mux.Handle("/clients", clients)
	adminLn, err := net.Listen("tcp", cfg.adminAddr)
	if err != nil {
		return fmt.Errorf("--admin-addr: %w", err)
	}
	admin := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	// The xDS listener.
	xdsLn, err := net.Listen("tcp", cfg.xdsAddr)
	if err != nil {
		adminLn.Close()
		return fmt.Errorf("--xds-addr: %w", err)
	}
	xdsCtx, stopXDS := context.WithCancel(context.Background())
	defer stopXDS()
	srv := server.NewServer(xdsCtx, xdsCache, callbacks)
	gs := grpc.NewServer(grpcOpts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	listenerservice.RegisterListenerDiscoveryServiceServer(gs, srv)
	routeservice.RegisterRouteDiscoveryServiceServer(gs, srv)
	clusterservice.RegisterClusterDiscoveryServiceServer(gs, srv)
	endpointservice.RegisterEndpointDiscoveryServiceServer(gs, srv)
	secretservice.RegisterSecretDiscoveryServiceServer(gs, srv)

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(3)
	go func() {
		defer wg.Done()
		if err := gs.Serve(xdsLn); err != nil {
			errs <- fmt.Errorf("xDS listener: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := admin.Serve(adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("admin listener: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		fol.follow(watchCtx)
	}()
	serving.Store(true)
	log.Info("serving", "xds", xdsLn.Addr().String(), "admin", adminLn.Addr().String(), "guard", cfg.guard, "cache", cfg.cacheKind,
		"owner_holds", cfg.ownerHolds, "resources", cfg.resources, "tls", tlsMode(cfg))
	if h.ready != nil {
		h.ready(xdsLn.Addr().String(), adminLn.Addr().String())
	}

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("stopping")
	case runErr = <-errs:
		log.Error("stopping", "error", runErr)
	}
	serving.Store(false)
	stopWatch()
	// Ending the server's context ends its streams; then the gRPC server stops gracefully, or
	// hard after stopTimeout.
	stopXDS()
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopTimeout):
		log.Warn("graceful stop timed out; stopping", "timeout", stopTimeout)
		gs.Stop()
		<-stopped
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := admin.Shutdown(shutCtx); err != nil {
		admin.Close()
	}
	wg.Wait()
	log.Info("stopped")
	return runErr // the deferred g.Close and rt.Close close the guard and the plugins
}

// kdsCacheTypes are what --cache kds serves: every type the resources file may hold, what others
// reference first.
var kdsCacheTypes = []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType,
	resource.ScopedRouteType, resource.VirtualHostType, resource.SecretType, resource.RuntimeType, resource.ExtensionConfigType}

// snapshotSetter serves resources as the SnapshotCache's one snapshot.
func snapshotSetter(c cache.SnapshotCache) func(context.Context, string, map[string][]types.Resource) error {
	return func(ctx context.Context, version string, res map[string][]types.Resource) error {
		snap, err := cache.NewSnapshot(version, res)
		if err != nil {
			return err
		}
		// No snap.Consistent(): it does not follow an API listener's RDS reference (grpc-go's
		// listeners), and a client waits for what is missing anyway.
		return c.SetSnapshot(ctx, snapshotKey, snap)
	}
}

// pluginOptions are the guard's options: the flags', and the policies of the plugin runtime
// that --plugin and --plugin-config start (nil without them: the guard's built-in policy).
func pluginOptions(cfg config, log hclog.Logger) (guard.Options, *policy.Runtime, error) {
	opts := guardOptions(cfg, log)
	rt, err := startPlugins(cfg, log)
	if err != nil || rt == nil {
		return opts, nil, err
	}
	opts.RetryPolicy = func() shared.RetryForcer { return rt.RetryForcer() }
	opts.Fallback = rt.Fallback()
	if cfg.ownerHolds {
		opts.OwnerCheck = rt.OwnerCheck // the owner-check plugin loaded, else the built-in one
	}
	return opts, rt, nil
}

// guardOptions are the guard's options that the flags set; pluginOptions adds the plugin runtime's.
func guardOptions(cfg config, log hclog.Logger) guard.Options {
	return guard.Options{NoHolds: !cfg.ownerHolds, Logger: slog.New(hclogslog.New(log.Named("guard"))), Metrics: policy.Metrics{Namespace: "kds_xds"},
		MaxTypesPerStream: cfg.maxTypesPerStream, MaxNamesPerStream: cfg.maxNamesPerStream, MaxStreamsPerNode: cfg.maxStreamsPerNode}
}

// tlsMode says how the xDS listener is secured, for the serving line.
func tlsMode(cfg config) string {
	switch {
	case cfg.tlsClientCA != "":
		return "mutual"
	case cfg.tlsCert != "":
		return "server"
	}
	return "plaintext"
}

// startPlugins starts the plugin runtime for --plugin and --plugin-config, or returns nil for
// neither (the guard's built-in policy).
func startPlugins(cfg config, log hclog.Logger) (*policy.Runtime, error) {
	if len(cfg.plugins) == 0 && len(cfg.pluginConfigs) == 0 {
		return nil, nil
	}
	var p policy.Plugins
	for _, v := range cfg.plugins {
		s, err := policy.ParseSpec(v)
		if err != nil {
			return nil, fmt.Errorf("--plugin: %w", err)
		}
		p.List = append(p.List, s)
	}
	for _, v := range cfg.pluginConfigs {
		if _, err := os.Stat(v); err != nil && strings.Contains(v, "=") {
			// NAME=FILE, as kds-host's --plugin-config.
			name, doc, err := policy.ReadDocumentFlag(v)
			if err != nil {
				return nil, fmt.Errorf("--plugin-config: %w", err)
			}
			if _, dup := p.Documents[name]; dup {
				return nil, fmt.Errorf("--plugin-config: two documents for plugin %q", name)
			}
			if p.Documents == nil {
				p.Documents = map[string]policy.Document{}
			}
			p.Documents[name] = doc
			continue
		}
		// FILE: the document of every --plugin, or of the built-in policy.
		data, err := os.ReadFile(v)
		if err != nil {
			return nil, fmt.Errorf("--plugin-config: %w", err)
		}
		if len(p.List) == 0 {
			p.List = append(p.List, policy.Spec{Path: policy.Builtin})
		}
		for i := range p.List {
			if p.List[i].Document != nil {
				return nil, fmt.Errorf("--plugin-config %s: plugin %s has a document already", v, p.List[i].Path)
			}
			p.List[i].Document = &policy.Document{Source: v, Data: data}
		}
	}
	// Its log reads as this server's (hclog), its metrics are kds_plugin_*.
	rt, err := policy.New(policy.Config{Plugins: p, Options: policy.Options{
		Logger: slog.New(hclogslog.New(log)), Metrics: policy.Metrics{Namespace: "kds"}}})
	if err != nil {
		return nil, fmt.Errorf("plugins: %w", err)
	}
	return rt, nil
}

// cacheLogger logs go-control-plane's cache messages through hclog.
func cacheLogger(l hclog.Logger) gcplog.Logger {
	return gcplog.LoggerFuncs{
		DebugFunc: func(format string, args ...any) { l.Debug(fmt.Sprintf(format, args...)) },
		InfoFunc:  func(format string, args ...any) { l.Debug(fmt.Sprintf(format, args...)) },
		WarnFunc:  func(format string, args ...any) { l.Warn(fmt.Sprintf(format, args...)) },
		ErrorFunc: func(format string, args ...any) { l.Error(fmt.Sprintf(format, args...)) },
	}
}

var (
	nacksDesc     = prometheus.NewDesc("kds_xds_nacks_total", "NACKs received from clients, by type.", []string{"type_url"}, nil)
	responsesDesc = prometheus.NewDesc("kds_xds_responses_total", "Responses sent to clients, by type.", []string{"type_url"}, nil)
)

// stockCounters are the server callbacks of --guard=false: they count the guard's two series,
// responses and NACKs by type (state of the world and delta, as the guard does), so both modes
// export them.
type stockCounters struct {
	server.CallbackFuncs
	log              hclog.Logger
	mu               sync.Mutex
	nacks, responses map[string]int64
}

// answered counts a NACK (a request answering a response with an error detail) and logs it;
// stream is negative for a delta stream.
func (c *stockCounters) answered(stream int64, node, typeURL, nonce, msg string, nack bool) {
	if !nack || nonce == "" {
		return
	}
	c.mu.Lock()
	c.nacks[typeURL]++
	c.mu.Unlock()
	c.log.Warn("NACK", "stream", stream, "node", node, "type", typeURL, "nonce", nonce, "error", msg)
}

func (c *stockCounters) sent(typeURL string) {
	c.mu.Lock()
	c.responses[typeURL]++
	c.mu.Unlock()
}

func newStockCounters(log hclog.Logger) *stockCounters {
	c := &stockCounters{log: log, nacks: map[string]int64{}, responses: map[string]int64{}}
	c.StreamRequestFunc = func(id int64, req *discovery.DiscoveryRequest) error {
		c.answered(id, req.GetNode().GetId(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
		return nil
	}
	c.StreamResponseFunc = func(_ context.Context, _ int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
		c.sent(resp.GetTypeUrl())
	}
	c.StreamDeltaRequestFunc = func(id int64, req *discovery.DeltaDiscoveryRequest) error {
		c.answered(-id, req.GetNode().GetId(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
		return nil
	}
	c.StreamDeltaResponseFunc = func(_ int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
		c.sent(resp.GetTypeUrl())
	}
	c.StreamOpenFunc = func(_ context.Context, id int64, typeURL string) error {
		c.log.Debug("stream open", "stream", id, "type", typeURL)
		return nil
	}
	c.StreamClosedFunc = func(id int64, node *core.Node) {
		c.log.Debug("stream closed", "stream", id, "node", node.GetId())
	}
	return c
}

func (c *stockCounters) Describe(ch chan<- *prometheus.Desc) {
	ch <- nacksDesc
	ch <- responsesDesc
}

func (c *stockCounters) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, n := range c.nacks {
		ch <- prometheus.MustNewConstMetric(nacksDesc, prometheus.CounterValue, float64(n), t)
	}
	for t, n := range c.responses {
		ch <- prometheus.MustNewConstMetric(responsesDesc, prometheus.CounterValue, float64(n), t)
	}
}

// goCollector exports the Go runtime's figures: go_memstats_* and go_gc_heap_live_bytes, the
// heap the last garbage collection found live (what the server holds, without its garbage).
func goCollector() prometheus.Collector {
	return collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)}))
}
