package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
)

// ZoneConfig is what a zone control plane needs.
type ZoneConfig struct {
	Store    store.Store
	Registry *resource.Registry
	// APIAddr and DiagAddr are listen addresses; ":0" picks a free port.
	APIAddr, DiagAddr string
	Logger            hclog.Logger
	Version           string
	// ProbeInterval is how often the store is probed for /readyz and kds_store_up (default
	// DefaultProbeInterval): they serve the last answer and never wait on the store.
	ProbeInterval time.Duration
	// KDS is the connection to the global; its Store, Registry and Logger are filled in.
	KDS zone.Config
}

// Zone is a running zone control plane.
type Zone struct {
	cfg     ZoneConfig
	log     hclog.Logger
	Client  *zone.Client
	API     *api.Server
	metrics *prometheus.Registry
	probe   *storeProbe // the store's readiness, on its own schedule (Run)
	api     *apiMetrics // kds_api_request_seconds

	apiLn, diagLn net.Listener
}

// NewZone assembles a zone and opens its listeners; call Run to serve.
func NewZone(cfg ZoneConfig) (*Zone, error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	cfg.KDS.Store, cfg.KDS.Registry, cfg.KDS.Logger = cfg.Store, cfg.Registry, cfg.Logger.Named("kds")
	metrics := newRegistry()
	applySeconds, applyTime := newZoneApplySeconds(metrics, cfg.KDS.Zone), cfg.KDS.ApplyTime
	cfg.KDS.ApplyTime = func(kind string, took time.Duration) {
		applySeconds.Observe(took.Seconds())
		if applyTime != nil {
			applyTime(kind, took)
		}
	}
	client, err := zone.New(cfg.KDS)
	if err != nil {
		return nil, err
	}
	z := &Zone{cfg: cfg, log: cfg.Logger, Client: client, metrics: metrics, probe: newStoreProbe(cfg.Store, cfg.ProbeInterval)}
	metrics.MustRegister(zoneClientCollector{zone: cfg.KDS.Zone, stats: client.Stats}, storeCollector{st: cfg.Store, probe: z.probe})
	registerBuildInfo(metrics, cfg.Version)
	observeStore(metrics, cfg.Store)
	z.api = newAPIMetrics(metrics)
	z.API = api.New(api.Config{Store: cfg.Store, Registry: cfg.Registry, ReadOnly: true, Logger: cfg.Logger.Named("api"), Version: cfg.Version, Mode: "zone"})
	z.API.Handle("GET /api/zone", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		api.WriteJSON(w, http.StatusOK, z.Client.Stats())
	}))
	// The operator's confirmation that the global's store was replaced on purpose: from this
	// machine only (the zone's API has no tokens).
	z.API.Handle("POST /api/zone/accept-global", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			api.WriteError(w, &api.Error{Status: http.StatusForbidden, Title: "Forbidden", Details: "accept-global is taken from this machine (loopback) only"})
			return
		}
		z.Client.AcceptNewGlobal()
		z.log.Warn("the operator accepted the global's new store: the zone syncs from it at its next connection")
		api.WriteJSON(w, http.StatusOK, map[string]string{"result": "the zone syncs from the global's current store at its next connection"})
	}))
	if z.apiLn, err = net.Listen("tcp", cfg.APIAddr); err != nil {
		return nil, fmt.Errorf("listen for the API on %s: %w", cfg.APIAddr, err)
	}
	if z.diagLn, err = net.Listen("tcp", cfg.DiagAddr); err != nil {
		z.apiLn.Close()
		return nil, fmt.Errorf("listen for diagnostics on %s: %w", cfg.DiagAddr, err)
	}
	return z, nil
}

// APIAddr and DiagAddr are the bound addresses.
func (z *Zone) APIAddr() string  { return z.apiLn.Addr().String() }
func (z *Zone) DiagAddr() string { return z.diagLn.Addr().String() }

// Run serves until ctx ends, then stops everything it started and returns.
func (z *Zone) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	apiServer := newHTTPServer(z.api.handler(apiRoute(z.API), withStatusPage(StatusPageConfig{Mode: pageZone}, z.API.Handler()))) // a read-only page at /gui (status.go)
	diagServer := newHTTPServer(diagHandler(z.metrics, func() (string, error) {
		if !z.Client.Stats().Connected {
			return "", errors.New("not connected to the global")
		}
		return z.probe.ready()
	}, false))

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	run("KDS client", func() error { return z.Client.Run(ctx) })
	run("API server", func() error { return apiServer.Serve(z.apiLn) })
	run("diagnostics server", func() error { return diagServer.Serve(z.diagLn) })
	run("store probe", func() error { z.probe.run(ctx); return nil })
	z.log.Info("zone control plane serving its API; connecting to its global", "zone", z.cfg.KDS.Zone, "global", z.cfg.KDS.GlobalAddress, "api", z.APIAddr(), "diagnostics", z.DiagAddr())
	<-ctx.Done()
	shutdown(apiServer, diagServer)
	wg.Wait()
	close(errs)
	return <-errs
}
