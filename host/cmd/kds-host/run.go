package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

// runFlags are the flags of `kds-host` itself (running a control plane).
type runFlags struct {
	mode              string
	dataDir           string
	store             string
	acceptNewStore    bool
	replicaID         string
	replicaAddress    string
	storeRelay        bool
	kdsAddr           string
	apiAddr           string
	diagAddr          string
	zoneName          string
	globalAddress     string
	tlsCert, tlsKey   string
	tlsCA             string
	tlsSkipVerify     bool
	plaintext         bool
	admissionOutages  []string
	admissionDeny     []string
	plainXDS          bool
	reRequestRate     float64
	reRequestBurst    int
	kdsAuth           string
	clientCA          string
	signingKey        string
	verifyKeys        []string
	zoneGrace         time.Duration
	probeInterval     time.Duration
	limits            engine.Limits
	responseTimeout   time.Duration
	maxReceive        int
	maxStreamsPerConn uint32
	maxRequest        int
	arrivals          engine.RateLimit
	arrivalWait       time.Duration
	apiTLSCert        string
	apiTLSKey         string
	zoneTokenFile     string
	clientCert        string
	clientKey         string
	acceptNewGlobal   bool
	profiles          bool
	logLevel          string
	logJSON           bool
	policyTimeout     time.Duration
	emulate           string
	nackBackoff       time.Duration
	ownerHolds        bool
	ownerTimeout      time.Duration
	plugins           pluginFlags // plugins.go
}

// addRunFlags defines the run flags on cmd and returns where their values land.
func addRunFlags(cmd *cobra.Command) *runFlags {
	flags := &runFlags{}
	f := cmd.Flags()
	f.StringVar(&flags.mode, "mode", "global", "global or zone")
	f.StringVar(&flags.dataDir, "data-dir", ".data/kds-host", "folder for the SQLite database and the self-signed KDS certificate")
	f.StringVar(&flags.store, "store", "", "database: empty for SQLite under --data-dir, a path ending in .db, or postgres://user:pass@host/db")
	f.BoolVar(&flags.acceptNewStore, "accept-new-store", false, "global: serve a store whose id is not the one recorded in <data-dir>/store-id (a new or replaced database, on purpose) and record its id; without it the global refuses to start on such a store")
	f.StringVar(&flags.kdsAddr, "kds-addr", ":5685", "global: KDS gRPC listen address")
	f.StringVar(&flags.replicaID, "replica-id", "", "global: this replica's name among the replicas sharing a PostgreSQL store, shown in /api/zones (default: host name and KDS port)")
	f.StringVar(&flags.replicaAddress, "replica-address", "", "global: the KDS address zones reach this replica at, shown in /api/zones (default: grpc(s)://<host name>:<KDS port>)")
	f.BoolVar(&flags.storeRelay, "store-relay", true, "global, PostgreSQL store: let one replica (the holder of the database's relay lock) LISTEN for writes and pass them on to the others over their KDS listeners, so PostgreSQL wakes one backend per write whatever the replicas; the others follow it with a replica token signed by the shared --signing-key (over TLS, they must share the KDS certificate or its issuer), and any that cannot follow listens itself. Off: every replica LISTENs")
	f.StringVar(&flags.apiAddr, "api-addr", "", "HTTP API listen address (default 127.0.0.1:5681 global, 127.0.0.1:15681 zone)")
	f.StringVar(&flags.diagAddr, "diag-addr", "", "metrics, /healthz and /readyz listen address (default 127.0.0.1:5680 global, 127.0.0.1:15680 zone)")
	f.StringVar(&flags.zoneName, "zone-name", "", "zone: this zone's name, sent as the xDS node id")
	f.StringVar(&flags.globalAddress, "global-address", "", "zone: the global's KDS address, grpcs://host:5685 (TLS) or grpc://host:5685 (plaintext); several replicas' addresses comma-separated (a host name resolving to several addresses stands for each): the zone uses one and moves to the next when it fails")
	f.StringVar(&flags.tlsCert, "kds-tls-cert", "", "global: KDS certificate file (default: a self-signed one under --data-dir)")
	f.StringVar(&flags.tlsKey, "kds-tls-key", "", "global: KDS private key file")
	f.StringVar(&flags.tlsCA, "kds-tls-ca", "", "zone: CA file that signed the global's KDS certificate")
	f.BoolVar(&flags.tlsSkipVerify, "kds-tls-skip-verify", false, "zone: do not verify the global's KDS certificate (testing only)")
	f.BoolVar(&flags.plaintext, "kds-plaintext", false, "global: serve KDS without TLS (loopback, benchmarks); zones dial grpc://")
	f.StringSliceVar(&flags.admissionOutages, "admission-outage", nil, "zone, fault injection: KIND=DURATION rejects every write of KIND for DURATION after start, like an admission webhook that is not ready (repeatable)")
	f.StringSliceVar(&flags.admissionDeny, "admission-deny-label", nil, "zone, fault injection: KEY=VALUE makes the zone's admission refuse, as INVALID, every resource with that label, as a webhook with a rule the global does not know would (repeatable)")
	f.BoolVar(&flags.plainXDS, "plain-xds", false, "zone: behave as a plain xDS client, as Kuma's zone does: NACK with a message only (no structured rejections or causes) and never ask again for what was refused; the global's retry timer alone brings it back")
	f.Float64Var(&flags.reRequestRate, "rerequest-rate", 20, "global: names a zone may ask for again per second, across its streams (names it refused, asked for again once their cause cleared); a re-request beyond it is not answered and is counted in kds_rerequests_total")
	f.IntVar(&flags.reRequestBurst, "rerequest-burst", 40, "global: names a zone may ask for again at once, above --rerequest-rate (a re-request of more names costs this much)")
	f.StringVar(&flags.kdsAuth, "kds-auth", "token", "global: how zones prove their name on KDS: token (a zone token, or with --kds-tls-client-ca a client certificate naming the zone) or none (anyone may claim any zone: loopback experiments only)")
	f.StringVar(&flags.clientCA, "kds-tls-client-ca", "", "global: CA file whose client certificates prove a zone's name (its first DNS SAN), as an alternative to a zone token")
	f.StringVar(&flags.signingKey, "token-signing-key", "", "global: Ed25519 key (PEM) that signs zone and user tokens (default: one made at first start under --data-dir/keys, mode 0600)")
	f.StringSliceVar(&flags.verifyKeys, "token-verification-key", nil, "global: more keys (PEM, public or private) whose tokens are accepted, e.g. the key before a rotation (repeatable)")
	f.DurationVar(&flags.zoneGrace, "zone-grace", time.Minute, "global: how long a zone's state (owner verdicts, insights, metrics series) outlives its last stream")
	f.DurationVar(&flags.probeInterval, "store-probe-interval", controlplane.DefaultProbeInterval, "how often the store is probed (a revision read within 2s) for /readyz and kds_store_up, which report the last probe and never wait on the store")
	f.IntVar(&flags.limits.MaxNodes, "max-zones", engine.DefaultLimits().MaxNodes, "global: zones with an open stream at most; more are refused (ResourceExhausted)")
	f.IntVar(&flags.limits.MaxNodeIDLength, "max-node-id-length", engine.DefaultLimits().MaxNodeIDLength, "global: bytes of a node id (the zone name) at most")
	f.IntVar(&flags.limits.MaxNACKMessage, "max-nack-message", engine.DefaultLimits().MaxNACKMessage, "global: bytes of a NACK's message kept; longer ones are truncated")
	f.Int64Var(&flags.limits.MaxInFlightBytes, "kds-max-inflight-bytes", engine.DefaultLimits().MaxInFlightBytes, "global: bytes of KDS responses sent and not yet answered by their zones: each zone stream's share (this / streams) goes at once, a larger response waits for room in this much across zones, so a full sync of many zones goes a few zones at a time, and a zone that stops reading holds only what it was given")
	f.DurationVar(&flags.responseTimeout, "kds-response-timeout", engine.DefaultLimits().ResponseTimeout, "global: close a zone's stream when a response it was sent stays unanswered this long (a zone that stops reading, its window full), counted in kds_stream_refusals_total{reason=\"stalled\"}; the zone connects again; 0: never")
	f.IntVar(&flags.limits.MaxMessage, "kds-max-message", engine.DefaultLimits().MaxMessage, "global: bytes of one KDS response at most; a kind larger goes in several responses, and the API refuses a resource larger than this (keep it under the zones' --kds-max-receive-message)")
	f.IntVar(&flags.limits.MaxUnknownNames, "kds-max-unknown-names", engine.DefaultLimits().MaxUnknownNames, "global: names one zone stream may subscribe to, or report holding in initial_resource_versions, that the global does not hold; a request beyond it is refused (ResourceExhausted) and counted in kds_stream_refusals_total{reason=\"limit\"}")
	f.IntVar(&flags.maxReceive, "kds-max-receive-message", 64<<20, "zone: bytes of one KDS response the zone accepts (the global's --kds-max-message must stay under it)")
	f.Uint32Var(&flags.maxStreamsPerConn, "max-streams-per-connection", 16, "global: KDS streams one connection may have open (HTTP/2's limit: a client waits to open more, or its stream is reset)")
	f.IntVar(&flags.maxRequest, "kds-max-request", engine.DefaultMaxRequestBytes, "global: bytes of one message a zone sends on KDS (its ACKs, NACKs and, on a new stream, the names and versions it holds); a larger one is refused as it arrives (ResourceExhausted) and counted in kds_stream_refusals_total{reason=\"limit\"}")
	f.Float64Var(&flags.arrivals.Rate, "kds-arrival-rate", 0, "global: new zone streams served per second at most, after they authenticate (0: no bound); the streams already served keep their pace when a fleet arrives at once (the zones of a replica that died). A stream beyond the rate waits its turn, or, if that is more than --kds-arrival-wait away, is refused (Unavailable) and counted in kds_stream_refusals_total{reason=\"arrivals\"}; its zone connects again after its backoff")
	f.IntVar(&flags.arrivals.Burst, "kds-arrival-burst", 100, "global: new zone streams served at once above --kds-arrival-rate")
	f.DurationVar(&flags.arrivalWait, "kds-arrival-wait", engine.DefaultArrivalWait, "global: how long a new zone stream may wait for its turn under --kds-arrival-rate before it is refused")
	f.StringVar(&flags.apiTLSCert, "api-tls-cert", "", "global: serve the HTTP API over TLS with this certificate (with --api-tls-key)")
	f.StringVar(&flags.apiTLSKey, "api-tls-key", "", "global: the HTTP API's TLS key")
	f.StringVar(&flags.zoneTokenFile, "zone-token-file", "", "zone: file holding this zone's token (from `kds-host token zone --name NAME` on the global)")
	f.StringVar(&flags.clientCert, "kds-tls-client-cert", "", "zone: client certificate naming this zone (first DNS SAN), for a global with --kds-tls-client-ca")
	f.StringVar(&flags.clientKey, "kds-tls-client-key", "", "zone: the client certificate's key")
	f.BoolVar(&flags.acceptNewGlobal, "accept-new-global", false, "zone: sync from the global even if it now serves another store than the zone synced from (its database was replaced on purpose); without it such a zone keeps what it holds and waits")
	f.BoolVar(&flags.profiles, "diag-pprof", false, "global: serve the Go profiles (net/http/pprof) under /debug/pprof/ on the diagnostics address (keep that address on loopback)")
	f.StringVar(&flags.logLevel, "log-level", "info", "trace, debug, info, warn or error")
	f.BoolVar(&flags.logJSON, "log-json", false, "log JSON lines")
	f.DurationVar(&flags.policyTimeout, "policy-timeout", 200*time.Millisecond, "global: deadline of a retry policy call; past it the built-in policy decides")
	f.StringVar(&flags.emulate, "emulate", "", "global, REPRODUCTION AID ONLY: blocking-per-type or blocking-per-stream reproduces the old retry that slept --nack-backoff inside the xDS callback, stalling the whole stream")
	f.DurationVar(&flags.nackBackoff, "nack-backoff", 5*time.Second, "global, with --emulate: how long each emulated sleep lasts")
	f.BoolVar(&flags.ownerHolds, "owner-holds", true, "global: hold a resource back from a zone until the zone has its owner (ask the owner check before each push)")
	f.DurationVar(&flags.ownerTimeout, "owner-check-timeout", time.Second, "global: deadline of one batched owner-check call; past it everything is sent (fail-open)")
	addPluginFlags(f, &flags.plugins)
	return flags
}

func (flags *runFlags) newLogger(name string) (hclog.Logger, error) {
	level := hclog.LevelFromString(flags.logLevel)
	if level == hclog.NoLevel {
		return nil, fmt.Errorf("--log-level %q: want trace, debug, info, warn or error", flags.logLevel)
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: level, JSONFormat: flags.logJSON, Output: os.Stderr}), nil
}

// parseOutages reads KIND=DURATION pairs.
func parseOutages(reg *resource.Registry, specs []string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, s := range specs {
		kind, d, ok := strings.Cut(s, "=")
		if !ok {
			return nil, fmt.Errorf("--admission-outage %q: want KIND=DURATION, e.g. Mesh=10s", s)
		}
		k, found := reg.Lookup(kind)
		if !found {
			return nil, fmt.Errorf("--admission-outage %q: unknown kind %q (known: %s)", s, kind, reg.KnownNames())
		}
		dur, err := time.ParseDuration(d)
		if err != nil || dur <= 0 {
			return nil, fmt.Errorf("--admission-outage %q: %q is not a positive duration", s, d)
		}
		out[k.Name] = dur
	}
	return out, nil
}

func (flags *runFlags) run(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unknown command %q for kds-host (see kds-host --help)", args[0])
	}
	log, err := flags.newLogger("kds-host")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reg := resource.Default()
	if flags.probeInterval <= 0 {
		return fmt.Errorf("--store-probe-interval %s: want a positive duration, e.g. 2s", flags.probeInterval)
	}

	switch flags.mode {
	case "global":
		return flags.runGlobal(ctx, log, reg)
	case "zone":
		return flags.runZone(ctx, log, reg)
	}
	return fmt.Errorf("--mode %q: want global or zone", flags.mode)
}

func (flags *runFlags) openStore(ctx context.Context) (store.Store, error) {
	st, err := store.Open(ctx, flags.store, flags.dataDir)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return st, nil
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func (flags *runFlags) runGlobal(ctx context.Context, log hclog.Logger, reg *resource.Registry) error {
	if flags.zoneName != "" || flags.globalAddress != "" || len(flags.admissionOutages) > 0 || len(flags.admissionDeny) > 0 || flags.plainXDS {
		return fmt.Errorf("--zone-name, --global-address, --admission-outage, --admission-deny-label and --plain-xds are zone flags; add --mode zone")
	}
	if flags.reRequestRate <= 0 || flags.reRequestBurst < 1 {
		return fmt.Errorf("--rerequest-rate must be > 0 and --rerequest-burst at least 1 (got %g and %d)", flags.reRequestRate, flags.reRequestBurst)
	}
	switch flags.emulate {
	case "", retry.EmulatePerType, retry.EmulatePerStream:
	default:
		return fmt.Errorf("--emulate %q: want %s or %s", flags.emulate, retry.EmulatePerType, retry.EmulatePerStream)
	}
	if flags.zoneTokenFile != "" || flags.clientCert != "" || flags.clientKey != "" || flags.acceptNewGlobal {
		return fmt.Errorf("--zone-token-file, --kds-tls-client-cert, --kds-tls-client-key and --accept-new-global are zone flags; add --mode zone")
	}
	limits := flags.limits
	limits.ResponseTimeout = flags.responseTimeout
	if limits.ResponseTimeout <= 0 {
		limits.ResponseTimeout = -1 // never
	}
	limits.ReRequests = engine.RateLimit{Rate: flags.reRequestRate, Burst: flags.reRequestBurst}
	switch {
	case flags.arrivals.Rate < 0:
		return fmt.Errorf("--kds-arrival-rate %g: want 0 (no bound) or more", flags.arrivals.Rate)
	case flags.arrivals.Burst < 1:
		return fmt.Errorf("--kds-arrival-burst %d: want 1 or more", flags.arrivals.Burst)
	case flags.arrivalWait <= 0:
		return fmt.Errorf("--kds-arrival-wait %s: want more than 0", flags.arrivalWait)
	}
	cfg := controlplane.GlobalConfig{
		Registry: reg, Logger: log, Version: version,
		Builtin: retrypolicy.New(), PolicyTimeout: flags.policyTimeout,
		Emulate: flags.emulate, NACKBackoff: flags.nackBackoff,
		OwnerHolds: flags.ownerHolds, OwnerCheckTimeout: flags.ownerTimeout,
		Limits: limits, ZoneGrace: flags.zoneGrace, ProbeInterval: flags.probeInterval, MaxStreamsPerConnection: flags.maxStreamsPerConn, MaxRequestBytes: flags.maxRequest,
		Arrivals: flags.arrivals, ArrivalWait: flags.arrivalWait,
		Profiles:  flags.profiles,
		KDSAddr:   flags.kdsAddr,
		ReplicaID: flags.replicaID, ReplicaAddress: flags.replicaAddress, StoreRelay: flags.storeRelay,
		APIAddr:  orDefault(flags.apiAddr, "127.0.0.1:5681"),
		DiagAddr: orDefault(flags.diagAddr, "127.0.0.1:5680"),
	}
	if err := flags.setUpAuth(log, &cfg); err != nil {
		return err
	}
	// Plugins (plugins.go): started before the global, stopped after it.
	rt, err := flags.plugins.start(log, &cfg)
	if err != nil {
		return err
	}
	defer rt.Close()
	if !flags.plaintext {
		tc, err := kds.ServerTLS(flags.tlsCert, flags.tlsKey, filepath.Join(flags.dataDir, "tls"))
		if err != nil {
			return fmt.Errorf("--kds-tls-cert, --kds-tls-key: %w", err)
		}
		if flags.clientCA != "" {
			pool, err := readCAs(flags.clientCA)
			if err != nil {
				return fmt.Errorf("--kds-tls-client-ca: %w", err)
			}
			tc.ClientCAs, tc.ClientAuth = pool, tls.VerifyClientCertIfGiven
			cfg.ClientCerts = true
		}
		cfg.TLS = tc
	} else if flags.clientCA != "" {
		return fmt.Errorf("--kds-tls-client-ca needs TLS: drop --kds-plaintext")
	}
	st, err := flags.openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	cfg.Store = st
	if err := controlplane.CheckStoreIdentity(ctx, st, flags.dataDir, flags.acceptNewStore, log); err != nil {
		var lost *controlplane.StoreIdentityError
		if errors.As(err, &lost) {
			err = fmt.Errorf("%w: start once with --accept-new-store (%s=true)", err, EnvName("accept-new-store"))
		}
		return err
	}
	g, err := controlplane.NewGlobal(cfg)
	if err != nil {
		return err
	}
	g.ServePlugins(rt, flags.plugins.load, flags.plugins.config) // /api/plugins and SIGHUP, for as long as Run runs
	return g.Run(ctx)
}

// zoneFlags name the flag of each zone.Config field.
var zoneFlags = map[string]string{
	"Zone": "zone-name", "GlobalAddress": "global-address", "TLSCAFile": "kds-tls-ca", "AdmissionOutage": "admission-outage",
	"ClientCertFile": "kds-tls-client-cert",
}

// setUpAuth loads the token keys, makes the admin token on first start, and sets how KDS and
// the API are guarded.
func (flags *runFlags) setUpAuth(log hclog.Logger, cfg *controlplane.GlobalConfig) error {
	switch flags.kdsAuth {
	case "token":
		cfg.KDSAuth = true
	case "none":
		log.Warn("--kds-auth none: any KDS client may claim to be any zone; use it on loopback experiments only")
	default:
		return fmt.Errorf("--kds-auth %q: want token or none", flags.kdsAuth)
	}
	keys, err := auth.LoadKeys(flags.dataDir, flags.signingKey, flags.verifyKeys)
	if err != nil {
		return fmt.Errorf("token keys (--token-signing-key, --token-verification-key): %w", err)
	}
	cfg.Keys = keys
	adminToken, err := auth.EnsureAdminToken(keys, flags.dataDir, time.Now())
	if err != nil {
		return err
	}
	// Said here, to whoever runs the global, and never in an answer that needs no token.
	log.Info("the admin token is in this file (mode 0600); the CLI on this machine reads it by itself", "file", adminToken)
	if (flags.apiTLSCert == "") != (flags.apiTLSKey == "") {
		return fmt.Errorf("--api-tls-cert and --api-tls-key go together")
	}
	if flags.apiTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(flags.apiTLSCert, flags.apiTLSKey)
		if err != nil {
			return fmt.Errorf("--api-tls-cert, --api-tls-key: %w", err)
		}
		cfg.APITLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	return nil
}

// readCAs reads a PEM file of CA certificates.
func readCAs(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// zoneFlagError names the flag behind a zone configuration error.
func zoneFlagError(err error) error {
	var ce *zone.ConfigError
	if errors.As(err, &ce) {
		if flag, ok := zoneFlags[ce.Field]; ok {
			return fmt.Errorf("--%s (%s): %w", flag, EnvName(flag), ce.Err)
		}
	}
	return err
}

func (flags *runFlags) runZone(ctx context.Context, log hclog.Logger, reg *resource.Registry) error {
	if err := flags.plugins.refuseInZone(); err != nil { // plugins.go
		return err
	}
	outages, err := parseOutages(reg, flags.admissionOutages)
	if err != nil {
		return err
	}
	deny := map[string]string{}
	for _, v := range flags.admissionDeny {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return fmt.Errorf("--admission-deny-label %q: want KEY=VALUE, e.g. kds-host.io/deny=true", v)
		}
		deny[k] = val
	}
	if flags.plaintext || flags.tlsCert != "" || flags.tlsKey != "" {
		return fmt.Errorf("--kds-plaintext, --kds-tls-cert and --kds-tls-key are global flags; a zone picks TLS by its --global-address scheme (grpc:// or grpcs://)")
	}
	cfg := controlplane.ZoneConfig{
		Registry: reg, Logger: log, Version: version, ProbeInterval: flags.probeInterval,
		APIAddr:  orDefault(flags.apiAddr, "127.0.0.1:15681"),
		DiagAddr: orDefault(flags.diagAddr, "127.0.0.1:15680"),
		KDS: zone.Config{MaxReceiveMessage: flags.maxReceive,
			Zone: flags.zoneName, GlobalAddress: flags.globalAddress,
			TLSCAFile: flags.tlsCA, TLSSkipVerify: flags.tlsSkipVerify,
			TokenFile: flags.zoneTokenFile, ClientCertFile: flags.clientCert, ClientKeyFile: flags.clientKey,
			AdmissionOutage: outages, AdmissionDeny: deny, Plain: flags.plainXDS,
			AcceptNewGlobal: flags.acceptNewGlobal,
		},
	}
	st, err := flags.openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	cfg.Store = st
	z, err := controlplane.NewZone(cfg)
	if err != nil {
		return zoneFlagError(err)
	}
	return z.Run(ctx)
}
