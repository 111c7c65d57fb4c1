package xdstest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
)

// Server is an xDS management server under test: it serves ADS (SotW) on Addr, plaintext, for
// the node NodeID, and counts per type URL the responses it sent and the NACKs it received.
type Server interface {
	Addr() string
	// Set makes resources (per type URL) the whole state of the world for NodeID, at version.
	Set(version string, resources map[string][]types.Resource) error
	NACKs(typeURL string) int
	Responses(typeURL string) int
}

// Counter counts responses and NACKs per type URL and keeps the last NACK messages; its
// Callbacks feed it from a go-control-plane server. Any Server can embed one.
type Counter struct {
	mu        sync.Mutex
	responses map[string]int
	nacks     map[string]int
	messages  []string
}

// MaxNACKMessages is how many NACK messages a Counter keeps (the last ones).
const MaxNACKMessages = 100

// OnRequest counts req if it is a NACK (has error_detail).
func (c *Counter) OnRequest(req *discovery.DiscoveryRequest) {
	if req.GetErrorDetail() == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nacks == nil {
		c.nacks = map[string]int{}
	}
	c.nacks[req.GetTypeUrl()]++
	c.messages = append(c.messages, fmt.Sprintf("%s version %s: %s", short(req.GetTypeUrl()), req.GetVersionInfo(), req.GetErrorDetail().GetMessage()))
	if len(c.messages) > MaxNACKMessages {
		c.messages = c.messages[len(c.messages)-MaxNACKMessages:]
	}
}

// OnResponse counts a response sent.
func (c *Counter) OnResponse(resp *discovery.DiscoveryResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.responses == nil {
		c.responses = map[string]int{}
	}
	c.responses[resp.GetTypeUrl()]++
}

// Callbacks are go-control-plane server callbacks that feed c.
func (c *Counter) Callbacks() server.CallbackFuncs {
	return server.CallbackFuncs{
		StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			c.OnRequest(req)
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			c.OnResponse(resp)
		},
	}
}

// NACKs is how many NACKs of typeURL were received ("" = all types).
func (c *Counter) NACKs(typeURL string) int { return c.count(c.nacks, typeURL) }

// Responses is how many responses of typeURL were sent ("" = all types).
func (c *Counter) Responses(typeURL string) int { return c.count(c.responses, typeURL) }

func (c *Counter) count(m map[string]int, typeURL string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if typeURL != "" {
		return m[typeURL]
	}
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// NACKMessages are the last NACK messages received ("<type> version <v>: <error_detail>").
func (c *Counter) NACKMessages() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.messages...)
}

func short(typeURL string) string {
	switch typeURL {
	case ListenerType:
		return "LDS"
	case RouteType:
		return "RDS"
	case ClusterType:
		return "CDS"
	case EndpointType:
		return "EDS"
	}
	return typeURL
}

// Stock is the stock go-control-plane v0.14 SotW ADS server: cache.NewSnapshotCache(ads=true,
// IDHash) and server.NewServer, with a Counter as callbacks, serving on 127.0.0.1:0. Built
// with Config.Linear, its cache is a MuxCache of LinearCaches instead.
type Stock struct {
	Counter
	Cache   cache.SnapshotCache           // nil with Config.Linear
	linear  map[string]*cache.LinearCache // by type URL, with Config.Linear
	addr    string
	grpc    *grpc.Server
	cancel  context.CancelFunc
	log     *countingLogger
	unwrap  func()
	own     func(map[string][]types.Resource) error // Config.Own's
	mu      sync.Mutex
	version int
}

// NewStock starts a stock server.
func NewStock() (*Stock, error) { return NewWrapped(nil) }

// Wrap puts something between the server and its cache: it returns the cache and the callbacks
// to serve with (built on the stock ones it is given), and what to call when the server stops.
type Wrap func(inner cache.Cache, cb server.Callbacks) (cache.Cache, server.Callbacks, func())

// NewWrapped starts the stock server with wrap (nil: none) between the server and its cache,
// the same SnapshotCache and the same counting callbacks: the guard runs here exactly as an
// outside server would adopt it.
func NewWrapped(wrap Wrap) (*Stock, error) { return NewServer(Config{Wrap: wrap}) }

// Config is how NewServer builds the server.
type Config struct {
	// Wrap is put between the server and its cache (nil: none).
	Wrap Wrap
	// Linear serves from a MuxCache of one LinearCache per type, chosen by type URL (a cache
	// that answers every node alike), instead of the SnapshotCache.
	Linear bool
	// ServerOptions, when set, gives the gRPC server's options, once the cache is wrapped.
	ServerOptions func() []grpc.ServerOption
	// Own, when set, serves from a cache of its own instead of the stock one: it returns the
	// cache and the callbacks to serve with (built on the stock ones it is given), how to set
	// its resources (Set), and what to call when the server stops.
	Own func(cb server.Callbacks) (cache.Cache, server.Callbacks, func(map[string][]types.Resource) error, func())
}

// NewServer starts the stock server as cfg says.
func NewServer(cfg Config) (*Stock, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Stock{log: &countingLogger{}}
	var c cache.Cache
	if cfg.Linear {
		mux := &cache.MuxCache{
			Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
			ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
			Caches:        map[string]cache.Cache{},
		}
		s.linear = map[string]*cache.LinearCache{}
		for _, t := range []string{ListenerType, RouteType, ClusterType, EndpointType} {
			s.linear[t] = cache.NewLinearCache(t)
			mux.Caches[t] = s.linear[t]
		}
		c = mux
	} else {
		s.Cache = cache.NewSnapshotCache(true, cache.IDHash{}, s.log)
		c = s.Cache
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	cb := s.Counter.Callbacks()
	var callbacks server.Callbacks = &cb
	if cfg.Wrap != nil {
		c, callbacks, s.unwrap = cfg.Wrap(c, callbacks)
	}
	if cfg.Own != nil {
		c, callbacks, s.own, s.unwrap = cfg.Own(callbacks)
	}
	xds := server.NewServer(ctx, c, callbacks)
	var opts []grpc.ServerOption
	if cfg.ServerOptions != nil {
		opts = cfg.ServerOptions()
	}
	s.grpc = grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(s.grpc, xds)
	s.addr = lis.Addr().String()
	go s.grpc.Serve(lis)
	return s, nil
}

// Addr is where the server serves ADS.
func (s *Stock) Addr() string { return s.addr }

// Set sets the snapshot of NodeID to resources at version; with Config.Linear, each type's
// LinearCache to its resources (at versions of its own).
func (s *Stock) Set(version string, resources map[string][]types.Resource) error {
	if s.own != nil {
		return s.own(resources)
	}
	if s.linear != nil {
		for t, lc := range s.linear {
			byName := map[string]types.Resource{}
			for _, r := range resources[t] {
				byName[cache.GetResourceName(r)] = r
			}
			lc.SetResources(byName)
		}
		return nil
	}
	rs := map[resource.Type][]types.Resource{}
	for k, v := range resources {
		rs[k] = v
	}
	snap, err := cache.NewSnapshot(version, rs)
	if err != nil {
		return err
	}
	return s.Cache.SetSnapshot(context.Background(), NodeID, snap)
}

// SetSnapshot sets resources at the next version ("1", "2", ...) and returns that version.
func (s *Stock) SetSnapshot(resources map[string][]types.Resource) (string, error) {
	s.mu.Lock()
	s.version++
	v := fmt.Sprint(s.version)
	s.mu.Unlock()
	return v, s.Set(v, resources)
}

// NotResponding is how many times the cache logged "ADS mode: not responding" (a request whose
// names are not a superset of the snapshot's names of that type).
func (s *Stock) NotResponding() int { return s.log.notResponding() }

// Close stops the server.
func (s *Stock) Close() {
	s.grpc.Stop()
	s.cancel()
	if s.unwrap != nil {
		s.unwrap()
	}
}

type countingLogger struct {
	mu sync.Mutex
	nr int
}

func (l *countingLogger) notResponding() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nr
}

func (l *countingLogger) Debugf(string, ...any) {}
func (l *countingLogger) Infof(string, ...any)  {}
func (l *countingLogger) Errorf(string, ...any) {}
func (l *countingLogger) Warnf(format string, _ ...any) {
	if strings.Contains(format, "not responding") {
		l.mu.Lock()
		l.nr++
		l.mu.Unlock()
	}
}
