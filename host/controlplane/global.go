// Package controlplane assembles a running control plane from its parts: a global (store, KDS
// server, API, diagnostics) or a zone (store, KDS client, read-only API, diagnostics).
package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/owner"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/internal/hclogslog"
	"github.com/kds-host/kds-host/internal/lograte"
	"github.com/kds-host/kds-host/internal/stack"
	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	"github.com/kds-host/kds-host/shared"
)

// GlobalConfig is what a global control plane needs.
type GlobalConfig struct {
	Store    store.Store
	Registry *resource.Registry
	// KDSAddr, APIAddr and DiagAddr are listen addresses; ":0" picks a free port.
	KDSAddr, APIAddr, DiagAddr string
	// TLS serves KDS over TLS; nil serves plaintext.
	TLS     *tls.Config
	Logger  hclog.Logger
	Version string
	// PollInterval is how often the store's revision is read to notice writes by other
	// replicas sharing the database (default 1s). A PostgreSQL store hears them by LISTEN (or
	// its own polling while that is down) and answers a tick from its log of what the
	// notifications carried, without reading the database, once it has heard of a write.
	PollInterval time.Duration
	// ProbeInterval is how often the store is probed for /readyz and kds_store_up (default
	// DefaultProbeInterval): they serve the last answer and never wait on the store.
	ProbeInterval time.Duration

	// RetryPolicy returns the retry policy in force (the plugin runtime's current one); nil
	// uses Builtin. Builtin is the in-process policy, also the fallback.
	RetryPolicy func() shared.RetryForcer
	Builtin     shared.RetryForcer
	// PolicyTimeout is the deadline of a retry policy call (default 200ms).
	PolicyTimeout time.Duration
	// RetryBounds are what the host accepts of a retry decision (--retry-max-delay; zero
	// fields: shared's defaults); a decision outside them is refused and the built-in policy
	// decides instead.
	RetryBounds shared.Bounds
	// Emulate reproduces an old, blocking retry behaviour (retry.EmulatePerType or
	// retry.EmulatePerStream), sleeping NACKBackoff inside the xDS callback. Empty: async retry.
	Emulate     string
	NACKBackoff time.Duration

	// Limits bound what zones may cost: node id length, zones in total, NACK text kept, and
	// how often a stream's re-requests are answered (zero fields: engine.DefaultLimits).
	Limits engine.Limits
	// MaxStreamsPerConnection bounds the KDS streams of one connection (default 16).
	MaxStreamsPerConnection uint32
	// MaxRequestBytes bounds one message a zone sends on KDS (default engine.DefaultMaxRequestBytes);
	// a larger one ends its stream with ResourceExhausted.
	MaxRequestBytes int
	// Arrivals bounds how fast new zone streams are served, and ArrivalWait how long one waits
	// for its turn (engine.ADSConfig's; a zero Rate: no bound).
	Arrivals    engine.RateLimit
	ArrivalWait time.Duration
	// ZoneGrace is how long a zone's state (its table entry, owner verdicts, metrics series)
	// outlives its last stream, so a flapping zone is not checked again from scratch (default 1m).
	ZoneGrace time.Duration

	// Keys checks zone tokens on KDS streams (when KDSAuth) and user tokens on the API, and
	// mints both. Nil: no authentication at all (tests of other things only).
	Keys *auth.Keys
	// KDSAuth requires every KDS stream to prove its zone (a zone token, or with ClientCerts a
	// client certificate naming it). Off (--kds-auth none), any client may claim any zone.
	KDSAuth     bool
	ClientCerts bool
	// APITLS serves the API over TLS; nil serves plain HTTP.
	APITLS *tls.Config
	// StoreID is the store's id, sent to each zone at the start of its stream: a zone notices
	// a global that comes back with another store, and keeps what it holds (default: read from
	// the store).
	StoreID string

	// OwnerCheck returns the owner-check policy in force (default: the built-in prediction).
	OwnerCheck func() shared.OwnerCheck
	// OwnerCheckGeneration changes whenever another owner check comes into force (a plugin
	// reload). Zones that hold the same share one Predict answer only within a generation, and
	// only when the check declares itself zone_independent; nil (with OwnerCheck set) shares
	// nothing. With the default OwnerCheck it is a constant.
	OwnerCheckGeneration func() uint64
	// OwnerHolds holds a resource back from a zone until its owner is there (docs/architecture.md,
	// Owner holds). Off, everything is sent at once and retries cover rejections.
	OwnerHolds bool
	// OwnerCheckTimeout is the deadline of one batched Predict call (default 1s).
	OwnerCheckTimeout time.Duration

	// Profiles serves the Go profiles (net/http/pprof) under /debug/pprof/ on the diagnostics
	// address, which holds who may reach it: keep it on loopback.
	Profiles bool

	// Collectors are more Prometheus metrics to serve beside the global's own (the plugin
	// runtime's).
	Collectors []prometheus.Collector

	// ReplicaID names this global among the replicas sharing its store (default: the host
	// name and the KDS port); ReplicaAddress is where zones reach its KDS (default: the KDS
	// listener's, with the host name). Every HeartbeatInterval (default 2s) the replica records
	// in the store which zones are connected to it (replicas.go); /api/zones on any replica
	// shows them all.
	ReplicaID, ReplicaAddress string
	HeartbeatInterval         time.Duration
	// StoreRelay shares one LISTEN among the replicas of a PostgreSQL store (store.Relay): the
	// replica that holds the relay lock listens and passes each write's notification on over
	// kds.v1.ChangesRelay on its KDS listener; the others follow it with a replica token signed
	// by Keys. It needs Keys, shared by the replicas; other stores ignore it.
	StoreRelay bool
}

// Global is a running global control plane.
type Global struct {
	cfg     GlobalConfig
	log     hclog.Logger
	kds     *stack.Stack // the cache, the zone table, the retry scheduler and the owner holds below
	Cache   *engine.Cache
	Zones   *engine.Nodes
	Retry   *retry.Scheduler // nil when emulating
	Holds   *owner.Holds     // nil when owner holds are off
	tracker *engine.Tracker
	metrics *prometheus.Registry
	API     *api.Server

	kdsLn, apiLn, diagLn net.Listener
	zoneMetrics          *zoneMetrics         // the counters with a zone label, freed with the zone
	replicas             *replicas            // this replica's zones in the store, and the others' (replicas.go)
	timeline             *timeline            // each zone's latest NACKs, rounds and give-ups (timeline.go)
	unservable           *unservable          // stored resources the snapshot cannot encode (unservable.go)
	refusals             *lograte.Log         // the log of refused streams: a few lines a second per reason (logObserver)
	updateSeconds        prometheus.Histogram // how long each snapshot update took (sync)
	probe                *storeProbe          // the store's readiness and known zones, on its own schedule (Run)
	lag                  *zoneLag             // kds_zone_behind_resources, on the probe's schedule (Run)
	converge             *convergence         // kds_convergence_seconds (sync, and the streams' ACKs)
	apiSeconds           *apiMetrics          // kds_api_request_seconds
	grpcCodes            *grpcMetrics         // kds_grpc_server_handled_total
	builder              kds.SnapshotBuilder
	ready                chan struct{}
	// reloads reloads the plugins on SIGHUP until ctx ends (ServePlugins, plugins.go); Run
	// runs it. Nil without plugins.
	reloads func(ctx context.Context)
}

// NewGlobal assembles a global and opens its listeners, so an address of ":0" is resolved
// before Run; call Run to serve, or Close to release the listeners. When it fails, it has
// stopped whatever it started.
func NewGlobal(cfg GlobalConfig) (_ *Global, err error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.ZoneGrace <= 0 {
		cfg.ZoneGrace = time.Minute
	}
	g := &Global{cfg: cfg, log: cfg.Logger, ready: make(chan struct{}), metrics: newRegistry()}
	g.refusals = lograte.New(slog.New(hclogslog.New(g.log.Named("kds"))), time.Second, refusalLines, "reason")
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	for _, c := range cfg.Collectors {
		if err := g.metrics.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	if g.cfg.StoreID == "" && cfg.Store != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		g.cfg.StoreID, err = cfg.Store.ID(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read the store's id: %w", err)
		}
	}
	if g.cfg.OwnerCheck == nil {
		builtin := ownerpredict.New()
		g.cfg.OwnerCheck = func() shared.OwnerCheck { return builtin }
		g.cfg.OwnerCheckGeneration = func() uint64 { return 0 }
	}
	if cfg.Emulate == "" && cfg.Builtin == nil {
		return nil, errors.New("a built-in retry policy is required")
	}
	g.zoneMetrics = newZoneMetrics()
	g.metrics.MustRegister(g.zoneMetrics)
	g.converge = newConvergence(g.metrics) // before the cache: its observer is one of the cache's
	km := newKDSMetrics(g.metrics, g.zoneMetrics)
	rm := newRetryMetrics(g.metrics, g.zoneMetrics, g.log.Named("retry"))
	g.timeline = newTimeline()
	// The global serves its zones from the engine's assembled stack, as guard.NewCache serves an
	// adopter's clients; what is kds-host's own (its metrics, log, timeline and limits) it adds.
	sc := stack.Config{Types: cfg.Registry.Names(),
		RetryPolicy: cfg.RetryPolicy, Fallback: cfg.Builtin, PolicyTimeout: cfg.PolicyTimeout,
		Limits: cfg.Limits, Bounds: cfg.RetryBounds, OnFallback: rm.fallback, RetryHooks: g.timeline.hooks(rm.hooks()),
		Observers: []event.Observer{km.observer(), g.logObserver(), g.timeline.observer(), g.converge.observer()}, Emulate: cfg.Emulate, NACKBackoff: cfg.NACKBackoff,
		PlainNACKsMayPass: true, Grace: g.cfg.ZoneGrace, Forget: func(zone string) {
			g.zoneMetrics.forget(zone)
			g.timeline.forget(zone)
		}}
	if cfg.OwnerHolds {
		sc.OwnerCheck, sc.OwnerCheckTimeout = g.cfg.OwnerCheck, cfg.OwnerCheckTimeout
		sc.OwnerHooks, sc.OwnerGeneration = newOwnerMetrics(g.metrics, g.zoneMetrics).hooks(), g.cfg.OwnerCheckGeneration
		sc.OwnerMapping = ownerMapping
	}
	if g.kds, err = stack.New(sc); err != nil {
		return nil, err
	}
	g.Cache, g.Zones, g.Retry, g.Holds, g.tracker = g.kds.Cache, g.kds.Nodes, g.kds.Retry, g.kds.Holds, g.kds.Tracker
	g.zoneMetrics.insights = g.Zones.Insights
	if cfg.Emulate != "" {
		g.log.Warn("emulating an old, blocking retry behaviour: every NACK stalls its whole stream", "emulate", cfg.Emulate, "nack-backoff", cfg.NACKBackoff)
	}
	g.unservable = newUnservable(g.log.Named("sync"))
	g.metrics.MustRegister(newWithheldCollector(g), g.unservable)
	g.probe = newStoreProbe(cfg.Store, cfg.ProbeInterval)
	g.probe.log = g.log.Named("probe")
	registerBuildInfo(g.metrics, cfg.Version)
	observeStore(g.metrics, cfg.Store)
	g.apiSeconds, g.grpcCodes = newAPIMetrics(g.metrics), newGRPCMetrics(g.metrics)
	g.metrics.MustRegister(storeCollector{st: cfg.Store, probe: g.probe})
	g.updateSeconds = newSnapshotUpdateSeconds(g.metrics)
	maxMessage := cfg.Limits.MaxMessage
	if maxMessage <= 0 {
		maxMessage = engine.DefaultLimits().MaxMessage
	}
	g.API = api.New(api.Config{Store: cfg.Store, Registry: cfg.Registry, Logger: cfg.Logger.Named("api"), Version: cfg.Version, Mode: "global",
		MaxResourceWireBytes: maxMessage})
	g.API.Handle("GET /api/zones", http.HandlerFunc(g.serveZones))
	g.API.Handle("GET /api/timeline", http.HandlerFunc(g.serveTimeline))
	g.API.Handle("GET /api/unservable", http.HandlerFunc(g.serveUnservable))
	g.API.Handle("POST /api/check", http.HandlerFunc(g.serveCheck))
	g.API.Handle("POST /api/tokens/zone", g.serveToken(auth.KindZone))
	g.API.Handle("POST /api/tokens/user", g.serveToken(auth.KindUser))
	g.watchKnownZones()
	g.lag = newZoneLag(g)
	g.metrics.MustRegister(g.lag)

	if g.kdsLn, err = net.Listen("tcp", cfg.KDSAddr); err != nil {
		return nil, fmt.Errorf("listen for KDS on %s: %w", cfg.KDSAddr, err)
	}
	if g.apiLn, err = net.Listen("tcp", cfg.APIAddr); err != nil {
		return nil, fmt.Errorf("listen for the API on %s: %w", cfg.APIAddr, err)
	}
	if g.diagLn, err = net.Listen("tcp", cfg.DiagAddr); err != nil {
		return nil, fmt.Errorf("listen for diagnostics on %s: %w", cfg.DiagAddr, err)
	}
	g.replicas = newReplicas(&g.cfg, g.KDSAddr(), g.log.Named("replicas"))
	return g, nil
}

// KDSAddr, APIAddr and DiagAddr are the bound addresses.
func (g *Global) KDSAddr() string  { return g.kdsLn.Addr().String() }
func (g *Global) APIAddr() string  { return g.apiLn.Addr().String() }
func (g *Global) DiagAddr() string { return g.diagLn.Addr().String() }

// Close releases the listeners and workers of a global that was never Run.
func (g *Global) Close() {
	if g.kds != nil {
		g.kds.Close()
	}
	g.refusals.Close()
	for _, ln := range []net.Listener{g.kdsLn, g.apiLn, g.diagLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// Run serves until ctx ends, then stops everything it started and returns.
func (g *Global) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer g.refusals.Close() // after the streams: the last refusals' count is written
	defer g.kds.Close()

	scfg := kds.ServerConfig{TLS: g.cfg.TLS, MaxStreamsPerConnection: g.cfg.MaxStreamsPerConnection, MaxRequestBytes: g.cfg.MaxRequestBytes,
		Arrivals: g.cfg.Arrivals, ArrivalWait: g.cfg.ArrivalWait, Conns: engine.NewConns(), Options: g.grpcCodes.options()}
	if g.cfg.KDSAuth && g.cfg.Keys != nil {
		scfg.Authenticate = auth.ZoneAuth{Keys: g.cfg.Keys, Certs: g.cfg.ClientCerts}.Authenticate
	}
	if g.cfg.StoreID != "" {
		scfg.Header = metadata.Pairs(StoreIDHeader, g.cfg.StoreID)
	}
	grpcServer, health := kds.NewGRPCServer(ctx, g.Cache, g.tracker, scfg)
	relayStore, relay := g.storeRelay()
	if relay != nil {
		kdsv1.RegisterChangesRelayServer(grpcServer, relayServer{r: relay})
		relayStore.SetRelay(relay)
	}
	apiServer := newHTTPServer(g.apiSeconds.handler(apiRoute(g.API), g.apiHandler()))
	diagServer := newHTTPServer(diagHandler(g.metrics, func() (string, error) {
		if !g.isReady() {
			return "", errors.New("the first snapshot is not built yet")
		}
		return g.probe.ready()
	}, g.cfg.Profiles))

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	run("sync", func() error { return g.sync(ctx) })
	run("KDS server", func() error { return grpcServer.Serve(g.kdsLn) })
	run("API server", func() error {
		if g.cfg.APITLS != nil {
			apiServer.TLSConfig = g.cfg.APITLS
			return apiServer.ServeTLS(g.apiLn, "", "")
		}
		return apiServer.Serve(g.apiLn)
	})
	run("replica heartbeat", func() error { g.replicas.run(ctx, g.Zones); return nil })
	run("store probe", func() error { g.probe.run(ctx); return nil })
	run("zone lag", func() error { g.lag.run(ctx, lagEvery*g.probe.interval); return nil })
	run("diagnostics server", func() error { return diagServer.Serve(g.diagLn) })
	if g.reloads != nil {
		run("plugin reloads", func() error { g.reloads(ctx); return nil })
	}
	g.log.Info("global control plane up", "kds", g.KDSAddr(), "tls", g.cfg.TLS != nil, "kds-auth", g.cfg.KDSAuth, "api", g.APIAddr(), "diagnostics", g.DiagAddr())

	select {
	case <-ctx.Done():
	case <-g.ready:
		health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		<-ctx.Done()
	}
	health.Shutdown()
	shutdown(apiServer, diagServer)
	if relay != nil {
		// Before the KDS server stops: the hub's followers' streams end at once, and the relay
		// lock is free for the next hub.
		relayStore.SetRelay(nil)
	}
	stopGRPC(grpcServer)
	wg.Wait()
	close(errs)
	return <-errs
}

func (g *Global) isReady() bool {
	select {
	case <-g.ready:
		return true
	default:
		return false
	}
}

// sync keeps the KDS snapshot equal to the store: at start, after each write through this
// process, and when another replica's write moves the store's revision. It lists the whole store
// once, then applies only what changed since the revision it last saw (store.ChangesSince), so a
// write costs what it changed, not the size of the store; when the store cannot tell what changed
// (store.ErrResync: too far behind), it lists everything again. A row the store cannot read
// stops nothing: it is left out (or keeps the version served before) and listed as unservable,
// as is a resource that cannot be encoded; every poll tick reads those again by key (recheckMax
// at most, in turn), so one fixed by hand is served within a tick.
func (g *Global) sync(ctx context.Context) error {
	var lastRev int64 = -1
	var published bool // by the update under way
	publish := func(snap *engine.Snapshot) {
		g.kds.SetSnapshot(snap)
		published = true
	}
	// measured runs an update and observes how long it took when it published a snapshot.
	measured := func(update func() error) error {
		began := time.Now()
		published = false
		err := update()
		if published {
			g.updateSeconds.Observe(time.Since(began).Seconds())
		}
		return err
	}
	rebuild := func() error {
		// The revision first: a write between the two is in the List and is listed again as a
		// change since rev, which changes nothing.
		rev, err := g.cfg.Store.Revision(ctx)
		if err != nil {
			return err
		}
		if rev == lastRev {
			return nil
		}
		rs, err := g.cfg.Store.List(ctx, "", "")
		unreadable, err := unservableRows(err)
		if err != nil {
			return err
		}
		snap, err := g.builder.Build(rs, unreadable...)
		if err != nil {
			return err
		}
		g.unservable.set(g.builder.Unservable())
		publish(snap)
		lastRev = rev
		return nil
	}
	update := func() error {
		changed, deleted, rev, err := g.cfg.Store.ChangesSince(ctx, lastRev)
		if errors.Is(err, store.ErrResync) {
			g.log.Debug("rebuild the KDS snapshot from a full list", "reason", err)
			return rebuild()
		}
		unreadable, err := unservableRows(err)
		if err != nil || rev == lastRev {
			return err
		}
		prev := g.Cache.Snapshot()
		snap, err := g.builder.Update(changed, deleted, unreadable...)
		if err != nil {
			return err
		}
		g.unservable.set(g.builder.Unservable())
		if snap != prev {
			g.converge.written(prev, snap, changed, g.Zones.List(), time.Now())
			publish(snap)
		}
		lastRev = rev
		return nil
	}
	if err := measured(rebuild); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the first snapshot
		}
		return fmt.Errorf("first snapshot: %w", err)
	}
	// recheck reads again, by key, what the snapshot does not serve: a fix by hand in the
	// database moves no revision, so no ChangesSince returns it.
	var rechecked string // the last key read again
	recheck := func() error {
		var batch []kds.Unservable
		batch, rechecked = inTurn(g.builder.Unservable(), rechecked, recheckMax)
		if len(batch) == 0 {
			return nil
		}
		var read []resource.Resource
		var gone []resource.Key
		var unreadable []kds.Unservable
		for _, u := range batch {
			r, err := g.cfg.Store.Get(ctx, u.Key)
			var ce *store.ColumnError
			switch {
			case err == nil:
				read = append(read, r)
			case errors.Is(err, store.ErrNotFound):
				gone = append(gone, u.Key)
			case errors.As(err, &ce):
				unreadable = append(unreadable, unservableRow(ce))
			default:
				return fmt.Errorf("read %s again: %w", u.Key, err)
			}
		}
		prev := g.Cache.Snapshot()
		snap, err := g.builder.Update(read, gone, unreadable...)
		if err != nil {
			return err
		}
		g.unservable.set(g.builder.Unservable())
		if snap != prev {
			publish(snap)
		}
		return nil
	}
	close(g.ready)
	tick := time.NewTicker(g.cfg.PollInterval)
	defer tick.Stop()
	for {
		ticked := false
		select {
		case <-ctx.Done():
			return nil
		case <-g.cfg.Store.Changes():
		case <-tick.C:
			ticked = true
		}
		if err := measured(update); err != nil && ctx.Err() == nil {
			g.log.Error("update the KDS snapshot", "error", err)
		}
		if !ticked {
			continue
		}
		if err := measured(recheck); err != nil && ctx.Err() == nil {
			g.log.Error("read the unservable resources again", "error", err)
		}
	}
}

// ZoneView is one zone's insight as GET /api/zones and `kds-host inspect zones` show it: the
// engine's NodeInsight in kds-host's words (a node is a zone, a type URL a kind), under the JSON
// keys the API has always answered, with the retry state of its stream and what the global
// withholds from it.
type ZoneView struct {
	Zone      string    `json:"zone"`
	Connected bool      `json:"connected"`
	Stream    int64     `json:"stream,omitempty"`
	Since     time.Time `json:"since"`
	// Kinds are the KDS counters per kind, sorted by kind, and what is withheld of each.
	Kinds []*KindView `json:"kinds"`
	// Replica is the global replica the zone is connected to (this one, or another sharing
	// the store, as its heartbeat records), ReplicaAddress its KDS address, and Heartbeat when
	// another replica last recorded the stream (nil for this replica's own).
	Replica        string     `json:"replica,omitempty"`
	ReplicaAddress string     `json:"replicaAddress,omitempty"`
	Heartbeat      *time.Time `json:"heartbeat,omitempty"`
	Retry          *ZoneRetry `json:"retry,omitempty"`
	// Withheld is what the global withholds from the zone (owner holds: WAIT or REJECT); in a page
	// of GET /api/zones, the first 20, with WithheldTotal counting them all when there are more.
	Withheld      []Withheld `json:"withheld,omitempty"`
	WithheldTotal int        `json:"withheldTotal,omitempty"`
	// Held is Withheld under its old JSON name, for the clients that read "held".
	//
	// Deprecated: use Withheld (JSON "withheld"); "held" is emitted for one more release only.
	Held []Withheld `json:"held,omitempty"`
	// RetryWithheld names, by kind, the rejected names of Retry.Failing that owner holds now
	// withhold (all of them, whatever the page of Withheld shows): a round does not resend them,
	// and nothing is sent of them until the holds let them go.
	RetryWithheld map[string][]string `json:"retryWithheld,omitempty"`
}

// KindView is what happened to one kind on one zone: the engine's TypeInsight under the JSON keys
// the API has always answered, with what the global withholds of the kind.
type KindView struct {
	Kind      string            `json:"kind"`
	Sent      int64             `json:"sent"`
	Responses int64             `json:"responses"`
	ACKs      int64             `json:"acks"`
	NACKs     int64             `json:"nacks"`
	LastError string            `json:"lastError,omitempty"`
	Rejected  []event.Rejection `json:"rejected,omitempty"`
	// Withheld counts the resources of the kind the global withholds from the zone (owner
	// holds: WAIT or REJECT).
	Withheld int `json:"withheld,omitempty"`
	Known    int `json:"known"`
	// Held is Withheld under its old JSON name, for the clients that read "held".
	//
	// Deprecated: use Withheld (JSON "withheld"); "held" is emitted for one more release only.
	Held int `json:"held,omitempty"`
}

// zoneViewOf is zi in kds-host's words, its kinds copied (nil stays nil, empty stays empty: the
// JSON is the engine's as it was).
func zoneViewOf(zi engine.NodeInsight) ZoneView {
	zv := ZoneView{Zone: zi.Node, Connected: zi.Connected, Stream: zi.Stream, Since: zi.Since}
	if zi.Types != nil {
		zv.Kinds = make([]*KindView, 0, len(zi.Types))
	}
	for _, ti := range zi.Types {
		zv.Kinds = append(zv.Kinds, &KindView{Kind: ti.TypeURL, Sent: ti.Sent, Responses: ti.Responses, ACKs: ti.ACKs,
			NACKs: ti.NACKs, LastError: ti.LastError, Rejected: ti.Rejected, Known: ti.Known})
	}
	return zv
}

// retryWithheld is, by kind, the rejected names of rs that are withheld; nil for none.
func retryWithheld(rs *ZoneRetry, withheld []Withheld) map[string][]string {
	if rs == nil || len(rs.Failing) == 0 || len(withheld) == 0 {
		return nil
	}
	held := make(map[resource.Key]bool, len(withheld))
	for _, w := range withheld {
		held[w.Key] = true
	}
	var out map[string][]string
	for _, fk := range rs.Failing {
		for _, name := range fk.Rejected {
			if held[resource.KeyFromXDSName(fk.Kind, name)] {
				if out == nil {
					out = map[string][]string{}
				}
				out[fk.Kind] = append(out[fk.Kind], name)
			}
		}
	}
	return out
}

// ZoneViews returns every zone's insight, whole: GET /api/zones without a page or a bound.
func (g *Global) ZoneViews() []ZoneView {
	return g.zonesAnswer("", "", 0, math.MaxInt, math.MaxInt).Items
}

// zoneViews joins the zone table with the retry state of each connected zone's stream, read from
// its session (retryOf; nil: retry is off), and what is withheld (withheld nil: owner holds are
// off). /api/zones, polled every second, costs one lookup a zone.
func zoneViews(insights []engine.NodeInsight, retryOf func(stream int64) *ZoneRetry, withheld func(zone string) []Withheld) []ZoneView {
	var out []ZoneView
	for _, zi := range insights {
		zv := zoneViewOf(zi)
		if withheld != nil {
			zv.Withheld = withheld(zi.Node)
			zv.Held = zv.Withheld // deprecated JSON "held", kept one release
			perKind := map[string]int{}
			for _, h := range zv.Withheld {
				perKind[h.Key.Kind]++
			}
			for _, k := range zv.Kinds {
				k.Withheld = perKind[k.Kind]
				k.Held = k.Withheld
				delete(perKind, k.Kind)
			}
			for kind, n := range perKind { // withheld before anything of the kind was sent
				zv.Kinds = append(zv.Kinds, &KindView{Kind: kind, Withheld: n, Held: n})
			}
			sort.Slice(zv.Kinds, func(i, j int) bool { return zv.Kinds[i].Kind < zv.Kinds[j].Kind })
		}
		if zi.Connected && retryOf != nil {
			zv.Retry = retryOf(zi.Stream)
		}
		zv.RetryWithheld = retryWithheld(zv.Retry, zv.Withheld)
		out = append(out, zv)
	}
	return out
}
