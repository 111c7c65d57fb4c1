// Package zone is the zone side of KDS: it dials the global, subscribes to every kind, applies
// each response to the zone's database in one transaction, and ACKs, or NACKs with the
// structured list of what the database (or admission) refused.
package zone

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// Config is a zone's connection to its global.
type Config struct {
	Zone string
	// GlobalAddress is grpc://host:port (plaintext) or grpcs://host:port (TLS), or several of
	// them separated by commas: the replicas of one global, sharing its store. A host name
	// that resolves to several addresses stands for each of them.
	GlobalAddress string
	// GlobalAddresses are more addresses of the global's replicas, after GlobalAddress's.
	GlobalAddresses []string
	// TLSCAFile is the CA that signed the global's KDS certificate; empty uses the system roots.
	TLSCAFile     string
	TLSSkipVerify bool
	// TokenFile holds the zone token the zone proves its name with (read again at every
	// connection, so a new token is picked up); empty sends none (a global with --kds-auth none,
	// or a client certificate).
	TokenFile string
	// ClientCertFile and ClientKeyFile are a TLS client certificate whose first DNS SAN is the
	// zone's name, for a global that takes certificates (--kds-tls-client-ca).
	ClientCertFile, ClientKeyFile string
	Store                         store.Store
	Registry                      *resource.Registry
	// AdmissionOutage rejects every write of a kind for a while after Start, as an admission
	// webhook that is not ready yet would.
	AdmissionOutage map[string]time.Duration
	// AdmissionDeny refuses, as INVALID, every resource that carries one of these labels (key
	// -> value), as an admission webhook with a rule the global does not know would: fault
	// injection, for the reproduction and tests.
	AdmissionDeny map[string]string
	// AcceptNewGlobal syncs from the global even when it serves another store than the zone
	// synced from before (its database was replaced on purpose).
	AcceptNewGlobal bool
	// Plain makes the zone a plain xDS client, as Kuma's zone is: its NACKs carry a message
	// only (no structured rejections, no causes), and it never asks again for what it refused.
	// The global then converges with its retry timer alone.
	Plain  bool
	Logger hclog.Logger
	// DialTimeout bounds connecting and the first exchange (default 10s).
	DialTimeout time.Duration
	// BackoffMin and BackoffMax bound the reconnect backoff (defaults 100ms and 5s).
	BackoffMin, BackoffMax time.Duration
	// MaxReceiveMessage bounds one KDS response the zone accepts, in bytes (default 64 MiB).
	MaxReceiveMessage int
	// ProbeInterval and ProbeTimeout: while connected, the zone asks the global's health check
	// every ProbeInterval (default 5s) and ends the stream when no answer comes within
	// ProbeTimeout (default 4s), so a connection that died silently, or a global that stopped
	// answering, is noticed within ProbeInterval + ProbeTimeout (gRPC's own keepalive cannot
	// ping more often than every 10s).
	ProbeInterval, ProbeTimeout time.Duration
	// Applied, when set, is called after a response's transaction committed with the keys of
	// the resources it stored (removals and refused resources are not listed), before the ACK
	// or NACK is sent. It runs on the stream's goroutine and must return quickly. It is for
	// measurements (examples/bench); nil does nothing.
	Applied func(kind string, stored []resource.Key)
	// ApplyTime, when set, is called after each response was applied (stored, refused or both),
	// with how long that took, before its ACK or NACK is sent. It runs on the stream's goroutine
	// and must return quickly (the zone's metrics observe it); nil does nothing.
	ApplyTime func(kind string, took time.Duration)
}

// The zone's transport keepalive, under its health probe (Config.ProbeInterval): an HTTP/2 ping
// after Keepalive without traffic (gRPC's minimum), the connection given up when no answer
// comes within KeepaliveTimeout. The global accepts pings every 5s.
const (
	Keepalive        = 10 * time.Second
	KeepaliveTimeout = 4 * time.Second
)

// Window is the zone's flow-control window for its connection to the global, the stream's and
// the connection's: fixed, as Envoy's are, so that grpc-go does not probe the bandwidth-delay
// product with a PING after each response it receives (which the global must read and answer:
// system calls on the global a zone a write). 4 MiB moves a full sync at 40 MiB/s over a
// 100 ms round trip; it is also the most of it the zone holds unread.
const Window = 4 << 20

// Client keeps one zone connected to its global.
type Client struct {
	cfg     Config
	log     hclog.Logger
	started time.Time
	globals []global
	creds   credentials.TransportCredentials // for grpcs:// globals

	ready chan string // kinds whose admission outage just ended

	mu        sync.Mutex // guards stats and acceptNew
	stats     Stats
	acceptNew bool // take the global's next store id as the one to sync from
}

// Stats is what a zone has done since it started. LastError is why its last stream ended or
// failed, without file paths (the log has them): Stats are served without a token.
type Stats struct {
	Connected bool `json:"connected"`
	// Global is the replica the zone is connected to, or last tried.
	Global     string           `json:"global,omitempty"`
	Since      time.Time        `json:"since"`
	Sessions   int              `json:"sessions"`
	Responses  int64            `json:"responses"`
	ACKs       int64            `json:"acks"`
	NACKs      int64            `json:"nacks"`
	LastError  string           `json:"lastError,omitempty"`
	NACKByKind map[string]int64 `json:"nacksByKind,omitempty"`
	// ReRequests counts the times the zone asked its global again for names it had refused,
	// once their cause cleared.
	ReRequests int64 `json:"reRequests"`
	// Blocked says why the zone does not sync, when it does not (its global serves another
	// store than it synced from).
	Blocked string `json:"blocked,omitempty"`
}

// ConfigError is a Config field whose value cannot be used.
type ConfigError struct {
	Field string // the Config field's name
	Err   error
}

func (e *ConfigError) Error() string { return e.Field + ": " + e.Err.Error() }

func (e *ConfigError) Unwrap() error { return e.Err }

// ParseAddress splits grpc://host:port or grpcs://host:port into a dial target and whether it
// uses TLS.
func ParseAddress(addr string) (target string, useTLS bool, err error) {
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" {
		return "", false, fmt.Errorf("global address %q: want grpc://host:port or grpcs://host:port", addr)
	}
	switch u.Scheme {
	case "grpc":
		return u.Host, false, nil
	case "grpcs":
		return u.Host, true, nil
	}
	return "", false, fmt.Errorf("global address %q: scheme %q is neither grpc nor grpcs", addr, u.Scheme)
}

// global is one configured address of the global.
type global struct {
	addr   string // as configured
	target string // host:port
	tls    bool
}

// endpoint is one address to dial: a global's, or one its host name resolved to.
type endpoint struct {
	global
	ip string // the resolved address, or "" to dial the target as it is
}

func (e endpoint) String() string {
	if e.ip == "" {
		return e.addr
	}
	return e.addr + " (" + e.ip + ")"
}

// ParseAddresses reads a comma-separated list of global addresses (see ParseAddress).
func ParseAddresses(list string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if _, _, err := ParseAddress(a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// New checks the configuration and returns a client; Run connects it.
func New(cfg Config) (*Client, error) {
	if cfg.Zone == "" {
		return nil, &ConfigError{Field: "Zone", Err: errors.New("a zone name is required")}
	}
	addrs, err := ParseAddresses(strings.Join(append([]string{cfg.GlobalAddress}, cfg.GlobalAddresses...), ","))
	if err != nil {
		return nil, &ConfigError{Field: "GlobalAddress", Err: err}
	}
	if len(addrs) == 0 {
		return nil, &ConfigError{Field: "GlobalAddress", Err: errors.New("the global's address is required, e.g. grpcs://host:5685 (or several, comma-separated)")}
	}
	c := &Client{cfg: cfg, log: cfg.Logger, started: time.Now(), creds: insecure.NewCredentials(),
		ready: make(chan string, len(cfg.AdmissionOutage)), acceptNew: cfg.AcceptNewGlobal}
	useTLS := false
	for _, a := range addrs {
		target, t, _ := ParseAddress(a)
		c.globals = append(c.globals, global{addr: a, target: target, tls: t})
		useTLS = useTLS || t
	}
	if c.log == nil {
		c.log = hclog.NewNullLogger()
	}
	if c.cfg.DialTimeout <= 0 {
		c.cfg.DialTimeout = 10 * time.Second
	}
	if c.cfg.BackoffMin <= 0 {
		c.cfg.BackoffMin = 100 * time.Millisecond
	}
	if c.cfg.MaxReceiveMessage <= 0 {
		c.cfg.MaxReceiveMessage = 64 << 20
	}
	if c.cfg.ProbeInterval <= 0 {
		c.cfg.ProbeInterval = 5 * time.Second
	}
	if c.cfg.ProbeTimeout <= 0 {
		c.cfg.ProbeTimeout = 4 * time.Second
	}
	if c.cfg.BackoffMax <= 0 {
		c.cfg.BackoffMax = 5 * time.Second
	}
	if useTLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.TLSSkipVerify} //nolint:gosec // opt-in flag
		if cfg.TLSCAFile != "" {
			pem, err := os.ReadFile(cfg.TLSCAFile)
			if err != nil {
				return nil, &ConfigError{Field: "TLSCAFile", Err: fmt.Errorf("read the global's CA: %w", err)}
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, &ConfigError{Field: "TLSCAFile", Err: fmt.Errorf("%s holds no PEM certificate", cfg.TLSCAFile)}
			}
			tc.RootCAs = pool
		}
		if (cfg.ClientCertFile == "") != (cfg.ClientKeyFile == "") {
			return nil, &ConfigError{Field: "ClientCertFile", Err: errors.New("a client certificate and its key go together")}
		}
		if cfg.ClientCertFile != "" {
			cert, err := tls.LoadX509KeyPair(cfg.ClientCertFile, cfg.ClientKeyFile)
			if err != nil {
				return nil, &ConfigError{Field: "ClientCertFile", Err: err}
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		c.creds = credentials.NewTLS(tc)
	}
	for kind := range cfg.AdmissionOutage {
		if _, ok := cfg.Registry.Get(kind); !ok {
			return nil, &ConfigError{Field: "AdmissionOutage", Err: fmt.Errorf("unknown kind %q (known: %s)", kind, cfg.Registry.KnownNames())}
		}
	}
	return c, nil
}

// Stats returns a copy of the zone's counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.NACKByKind = make(map[string]int64, len(c.stats.NACKByKind))
	for k, v := range c.stats.NACKByKind {
		s.NACKByKind[k] = v
	}
	return s
}

// Run keeps the zone connected until ctx ends. When a stream ends, or an attempt fails, it
// moves on to the global's next address (each address in turn, a host name's resolved
// addresses each in turn), after a jittered backoff that starts short after a healthy stream
// and doubles with every round of addresses that all failed. Each new stream declares what the
// zone holds (initial_resource_versions), so a replica sends only what changed.
// Run also owns the admission outages' ends: when one ends, the zone says so in its log and
// asks its global again for what that admission refused.
func (c *Client) Run(ctx context.Context) error {
	for kind, d := range c.cfg.AdmissionOutage {
		t := time.AfterFunc(time.Until(c.started.Add(d)), func() {
			c.log.Info("admission webhook ready", "kind", kind, "after", d)
			select {
			case c.ready <- kind:
			case <-ctx.Done():
			}
		})
		defer t.Stop()
	}
	backoff := c.cfg.BackoffMin
	var eps []endpoint
	next, failed := 0, 0 // the endpoint to try; attempts failed in a row
	for {
		if next >= len(eps) {
			eps, next = c.endpoints(ctx), 0
		}
		ep := eps[next]
		next++
		began := time.Now()
		connected, err := c.session(ctx, ep)
		c.setConnected(false, err)
		if ctx.Err() != nil {
			return nil
		}
		if connected && time.Since(began) > time.Second {
			backoff, failed = c.cfg.BackoffMin, 0 // a healthy stream: try the next address soon
		} else if failed++; failed >= len(eps) {
			backoff, failed = min(backoff*2, c.cfg.BackoffMax), 0 // a whole round failed
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		c.log.Warn("KDS stream to global ended, reconnecting", "global", ep.String(), "error", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// probe asks the global's health check every ProbeInterval until ctx ends, and returns an error
// when an answer does not come within ProbeTimeout or says the global does not serve.
func (c *Client) probe(ctx context.Context, h healthpb.HealthClient) error {
	tick := time.NewTicker(c.cfg.ProbeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, c.cfg.ProbeTimeout)
		resp, err := h.Check(pctx, &healthpb.HealthCheckRequest{})
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("the global did not answer its health check within %s (the connection died, or the global is stuck): %w", c.cfg.ProbeTimeout, err)
		case resp.GetStatus() != healthpb.HealthCheckResponse_SERVING:
			return fmt.Errorf("the global's health check says %s", resp.GetStatus())
		}
	}
}

// endpoints is every address to try, in order: each configured global's, a host name's
// resolved addresses each (a name that does not resolve is dialled as it is, and fails then).
func (c *Client) endpoints(ctx context.Context) []endpoint {
	var out []endpoint
	for _, g := range c.globals {
		host, port, err := net.SplitHostPort(g.target)
		if err != nil || net.ParseIP(host) != nil {
			out = append(out, endpoint{global: g})
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
		ips, err := net.DefaultResolver.LookupHost(rctx, host)
		cancel()
		if err != nil || len(ips) < 2 {
			out = append(out, endpoint{global: g}) // one address: gRPC resolves it as it dials
			continue
		}
		for _, ip := range ips {
			out = append(out, endpoint{global: g, ip: net.JoinHostPort(ip, port)})
		}
	}
	return out
}

func (c *Client) setConnected(up bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Connected = up
	c.stats.Since = time.Now()
	if up {
		c.stats.Sessions++
	}
	if err != nil {
		c.stats.LastError = c.publicError(err) // Stats are served without a token
	}
}

// session runs one ADS stream to ep until it fails or ctx ends; connected says whether the
// stream got as far as the global's first answer.
func (c *Client) session(ctx context.Context, ep endpoint) (connected bool, err error) {
	c.mu.Lock()
	c.stats.Global = ep.String()
	c.mu.Unlock()
	creds := insecure.NewCredentials()
	if ep.tls {
		creds = c.creds
	}
	target, opts := ep.target, []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.cfg.MaxReceiveMessage)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: Keepalive, Timeout: KeepaliveTimeout, PermitWithoutStream: true}),
		grpc.WithStaticStreamWindowSize(Window), grpc.WithStaticConnWindowSize(Window),
	}
	if ep.ip != "" {
		// Dial the resolved address; TLS still checks the certificate against the name.
		target, opts = ep.ip, append(opts, grpc.WithAuthority(ep.target))
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", ep, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// The global answers a health check before the stream opens: that proves the address, TLS
	// and the server within the dial timeout, where a stream would wait silently.
	hctx, hcancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	hresp, err := healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{})
	hcancel()
	if err != nil {
		return connected, fmt.Errorf("reach global %s: %w%s", ep, err, tlsHint(err, c.cfg.TLSCAFile))
	}
	if hresp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return connected, fmt.Errorf("global %s is %s", ep, hresp.GetStatus())
	}
	sctx := ctx
	if c.cfg.TokenFile != "" {
		tok, err := auth.ReadTokenFile(c.cfg.TokenFile)
		if err != nil {
			return connected, fmt.Errorf("zone token: %w", err)
		}
		sctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(sctx)
	if err != nil {
		return connected, fmt.Errorf("open KDS stream to %s: %w", ep, err)
	}
	initial, err := c.initialVersions(ctx)
	if err != nil {
		return connected, err
	}
	node := &core.Node{Id: c.cfg.Zone}
	for _, kind := range c.cfg.Registry.Names() {
		req := &discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: kind, InitialResourceVersions: initial[kind]}
		if err := stream.Send(req); err != nil {
			if errors.Is(err, io.EOF) { // the global ended the stream: its status says why
				_, err = stream.Recv()
				return connected, fmt.Errorf("receive: %w", err)
			}
			return connected, fmt.Errorf("subscribe to %s: %w", kind, err)
		}
		node = nil // the node goes in the first request only
	}
	// The global says which store it serves before its first response; a global that comes back
	// with another store (a lost database) would have the zone delete everything it holds.
	header, err := stream.Header()
	if err != nil {
		return connected, fmt.Errorf("KDS stream to %s: %w", ep, err)
	}
	if err := c.checkGlobalStore(ctx, ep, header.Get(StoreIDHeader)); err != nil {
		return connected, err
	}
	connected = true
	c.setConnected(true, nil)
	c.log.Info("connected to global", "global", ep.String())

	// One goroutine receives; this one applies, answers, and asks again for what it refused once
	// the cause clears. The stream's context ends the receiver when the session returns.
	responses := make(chan *discovery.DeltaDiscoveryResponse)
	received := make(chan error, 2) // the receiver's end and the probe's, each once
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		// The health probe: a global that does not answer ends the session (received).
		if err := c.probe(ctx, healthpb.NewHealthClient(conn)); err != nil {
			received <- err
		}
	})
	wg.Go(func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				received <- err
				return
			}
			select {
			case responses <- resp:
			case <-ctx.Done():
				return
			}
		}
	})
	// sendFailed is the session's end when a send fails. io.EOF is grpc-go's sign that the global
	// ended the stream, and its status, the reason (a newer stream of this zone replaced it, the
	// global stops), is the receiver's to read: the session ends with that, not with "EOF". The
	// status has arrived by then; the wait is bounded all the same.
	sendFailed := func(what string, err error) error {
		if !errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: %w", what, err)
		}
		t := time.NewTimer(time.Second)
		defer t.Stop()
		for {
			select {
			case rerr := <-received:
				return fmt.Errorf("receive: %w", rerr)
			case <-responses: // the receiver was handing one over: the stream is over anyway
			case <-t.C:
				return fmt.Errorf("%s: %w", what, err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	refused := newRefusals()
	ask := func(kind string, names []string) error {
		if len(names) == 0 || c.cfg.Plain {
			return nil
		}
		c.mu.Lock()
		c.stats.ReRequests++
		c.mu.Unlock()
		c.log.Debug("asking the global again", "kind", kind, "names", len(names))
		if err := stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: kind, ResourceNamesSubscribe: names}); err != nil {
			return sendFailed("ask again for "+kind, err)
		}
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return connected, ctx.Err()
		case err := <-received:
			return connected, fmt.Errorf("receive: %w", err)
		case kind := <-c.ready:
			if err := ask(kind, refused.admissionReady(kind)); err != nil {
				return connected, err
			}
		case resp := <-responses:
			began := time.Now()
			out := c.apply(ctx, resp)
			if c.cfg.ApplyTime != nil {
				c.cfg.ApplyTime(resp.GetTypeUrl(), time.Since(began))
			}
			if err := stream.Send(out.reply); err != nil {
				return connected, sendFailed("send ACK/NACK", err)
			}
			refused.settled(resp.GetTypeUrl(), out.settled)
			refused.refused(resp.GetTypeUrl(), out.rejected)
			again := refused.ownersStored(out.stored)
			for _, kind := range slices.Sorted(maps.Keys(again)) {
				if err := ask(kind, again[kind]); err != nil {
					return connected, err
				}
			}
		}
	}
}

// StoreIDHeader is the stream header in which the global names its store (the same as
// controlplane.StoreIDHeader).
const StoreIDHeader = "kds-store-id"

// globalStoreKey is where the zone remembers, in its own store, the id of the global's store.
const globalStoreKey = "global-store-id"

// ErrNewGlobalStore is a global that serves another store than the one this zone synced from.
var ErrNewGlobalStore = errors.New("the global serves another store")

// checkGlobalStore compares the store id the global sent with the one the zone remembers: the
// first is remembered; another one stops the sync, keeping what the zone holds, until an
// operator accepts it (--accept-new-global, or AcceptNewGlobal).
// Every replica of one global shares its store, and so its id: a zone moves between them freely.
func (c *Client) checkGlobalStore(ctx context.Context, ep endpoint, ids []string) error {
	if len(ids) == 0 {
		return nil // a global that does not say (an older one): nothing to compare
	}
	id := ids[0]
	known, ok, err := c.cfg.Store.Meta(ctx, globalStoreKey)
	if err != nil {
		return fmt.Errorf("read the global's store id: %w", err)
	}
	c.mu.Lock()
	accept := c.acceptNew
	c.mu.Unlock()
	switch {
	case !ok:
	case known == id:
		c.setBlocked("")
		return nil
	case accept:
		c.log.Warn("accepting the global's new store as confirmed by the operator", "was", known, "now", id)
	default:
		msg := fmt.Sprintf("global %s now serves another store (id %s, this zone synced from %s): the zone keeps what it holds and does not sync; "+
			"if the global's store was replaced on purpose, restart the zone with --accept-new-global or POST /api/zone/accept-global on its API",
			ep, id, known)
		c.log.Error(msg)
		c.setBlocked(msg)
		return fmt.Errorf("%w: %s", ErrNewGlobalStore, msg)
	}
	if err := c.cfg.Store.SetMeta(ctx, globalStoreKey, id); err != nil {
		return fmt.Errorf("remember the global's store id: %w", err)
	}
	c.mu.Lock()
	c.acceptNew = c.cfg.AcceptNewGlobal
	c.mu.Unlock()
	c.setBlocked("")
	return nil
}

// AcceptNewGlobal lets the zone sync from a global whose store changed, once: its next stream
// takes the global's new store id as its own.
func (c *Client) AcceptNewGlobal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.acceptNew = true
}

func (c *Client) setBlocked(msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Blocked = msg
}

// initialVersions is what the zone's database holds, by kind, as the global versions it. A row
// the zone cannot read is left out: the global sends it again, and storing it fixes the row.
func (c *Client) initialVersions(ctx context.Context) (map[string]map[string]string, error) {
	rs, err := c.cfg.Store.List(ctx, "", "")
	if _, err = store.Unreadable(err); err != nil {
		return nil, fmt.Errorf("read the zone's resources: %w", err)
	}
	out := map[string]map[string]string{}
	for i := range rs {
		p, err := rs[i].ToProto()
		if err != nil {
			continue // unreadable: let the global send it again
		}
		k := rs[i].Key()
		if out[k.Kind] == nil {
			out[k.Kind] = map[string]string{}
		}
		out[k.Kind][k.XDSName()] = resource.Version(p)
	}
	return out, nil
}

// tlsHint says what to do about a global's certificate the zone does not trust.
func tlsHint(err error, caFile string) string {
	msg := err.Error()
	if !strings.Contains(msg, "x509:") && !strings.Contains(msg, "certificate") {
		return ""
	}
	if caFile != "" {
		return fmt.Sprintf(" (the zone trusts the CA in %s (--kds-tls-ca), which did not sign the global's certificate; a global with a self-signed one keeps it in <its --data-dir>/tls/kds.crt)", caFile)
	}
	return " (the zone does not trust the global's certificate: a global with a self-signed one keeps it in <its --data-dir>/tls/kds.crt; give it to the zone with --kds-tls-ca FILE (KDS_KDS_TLS_CA), or dial grpc:// a global with --kds-plaintext)"
}
