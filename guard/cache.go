package guard

// kds-host's own cache behind the guard's options: for a server that sets its resources itself.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/owner"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/internal/lograte"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// Cache is kds-host's own cache with the guard's NACK handling, retry and owner checks: for a
// server that sets its resources itself (SetResources) instead of keeping them in a
// go-control-plane cache that the guard wraps. It is what kds-host's global serves its zones
// from, and it serves go-control-plane's delta server only: a state-of-the-world client gets an
// error on its first request (wrap a SnapshotCache with New for those).
//
// What it adds to a wrapped cache: each stream's work follows only the names that changed (a
// write costs the streams that hold the changed names, not every stream every resource), one
// encoding of a version is shared by every stream, responses are handed to the server by one
// sender per stream that never holds a lock (so a stream of many types never blocks on the
// server's channel, go-control-plane issue 875), and the bytes of responses in flight are
// bounded across streams.
//
//	c, err := guard.NewCache([]string{resource.ClusterType, resource.EndpointType}, guard.Options{}, guard.KDSOptions{})
//	defer c.Close()
//	srv := server.NewServer(ctx, c, c.Callbacks(myCallbacks))
//	c.SetResources(map[string][]types.Resource{resource.ClusterType: {cluster}})
type Cache struct {
	*engine.Cache
	tracker *engine.Tracker
	zones   *engine.Nodes
	sched   *retry.Scheduler // nil when emulating an old behaviour
	holds   *owner.Holds     // nil without Options.OwnerCheck
	owners  func(typeURL string, r Resource) []Ref
	types   []string
	totals  totals
	setMu   sync.Mutex                          // one SetResources at a time
	built   map[string]map[string]*engine.Entry // SetResources' last entries, by type and name, reused while unchanged

	refusals *lograte.Log // refused streams, a few lines a second per reason

	grace  time.Duration
	forget func(client string)
	stop   chan struct{} // closed by Close: the expiry stops
	done   chan struct{}
	closed sync.Once
}

// KDSOptions tune NewCache beyond Options: kds-host's own global sets them (its metrics, its zone
// limits, its emulation of old behaviours); a server that adopts the package leaves them zero.
type KDSOptions struct {
	// Limits bound what each client may cost (zero fields: engine.DefaultLimits).
	Limits engine.Limits
	// Bounds are what a retry decision may say (zero fields: shared's defaults).
	Bounds shared.Bounds
	// OnFallback hears of each retry decision the built-in policy made instead of the plugin.
	OnFallback func(req *pluginv1.ScheduleRequest, err error)
	// RetryHooks hear of the retry rounds; they run after the cache's own.
	RetryHooks retry.Hooks
	// OwnerHooks, OwnerGeneration and OwnerMapping are the owner holds' (owner.Config). The zero
	// OwnerMapping suits the entries SetResources builds; kds-host's global, which sets its own
	// snapshots, passes the mapping of its resources.
	OwnerHooks      owner.Hooks
	OwnerGeneration func() uint64
	OwnerMapping    owner.Mapping
	// Observers hear of every stream event, after the zone table and before the retry scheduler.
	Observers []event.Observer
	// PlainNACKsMayPass: a NACK without kds-host's structured detail may refuse for a passing
	// reason (a kds-host zone run as a plain xDS client, as Kuma's zones are), so its names are
	// resent on the policy's backoff. Off (the default), such a NACK is about content, as Envoy's
	// and grpc-go's are: its names count as INVALID, tried the policy's attempts and then parked
	// until their content changes.
	PlainNACKsMayPass bool
	// ClientGrace is how long a client's state (what it holds, its owner verdicts) outlives its
	// last stream, so that one that reconnects is not checked again from scratch (default 1m).
	// Forget, if set, hears of each client whose grace ended.
	ClientGrace time.Duration
	Forget      func(client string)
	// Emulate reproduces an old, blocking retry behaviour (retry.EmulatePerType or
	// retry.EmulatePerStream), sleeping NACKBackoff (default 5s) inside the xDS callback.
	Emulate     string
	NACKBackoff time.Duration
}

// NewCache returns kds-host's cache for types, in the order a client should get them when they
// are ready together (what others reference first: clusters before their endpoints, listeners
// before their routes).
//
// Of Options, it reads the retry policy's (RetryPolicy, Fallback, PolicyTimeout), the owner
// check's (OwnerCheck, OwnerCheckTimeout: kds-host's owner holds, the check asked per client with
// the resources as kds.v1.Resource candidates whose kind is the type URL and whose owners are
// what Owners says they reference, none by default), and Logger. NoHolds does not apply: the
// guard's own holds (references, warm-up routes, kept removals) are the wrapping Guard's.
func NewCache(types []string, opts Options, kopts KDSOptions) (_ *Cache, err error) {
	if len(types) == 0 {
		return nil, errors.New("guard: NewCache needs the types it serves")
	}
	for i, t := range types {
		if t == "" || slices.Contains(types[:i], t) {
			return nil, fmt.Errorf("guard: type %q is empty or given twice", t)
		}
	}
	if opts.Owners == nil {
		// No owners by default: an Envoy or grpc-go client asks for a cluster's endpoints only
		// once it has the cluster, so what a resource references cannot always come first.
		opts.Owners = func(string, Resource) []Ref { return nil }
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if kopts.ClientGrace <= 0 {
		kopts.ClientGrace = time.Minute
	}
	kc := engine.NewCache(types)
	c := &Cache{Cache: kc, zones: engine.NewNodes(kc), owners: opts.Owners, types: slices.Clone(types), refusals: lograte.New(opts.Logger, time.Second, refusalLines, "reason"),
		grace: kopts.ClientGrace, forget: kopts.Forget, stop: make(chan struct{}), done: make(chan struct{})}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	observers := append([]event.Observer{c.zones.Observer(), c.counter()}, kopts.Observers...)
	switch kopts.Emulate {
	case "":
		hooks := loggingHooks(opts.Logger, kopts.RetryHooks)
		c.sched, err = newScheduler(opts, retry.StandardConfig{Timeout: opts.PolicyTimeout, Bounds: kopts.Bounds, OnFallback: kopts.OnFallback}, hooks,
			func(id int64) retry.Session {
				if s := kc.Session(id); s != nil {
					return s
				}
				return nil // not a typed nil
			})
		if err != nil {
			return nil, err
		}
		observers = append(observers, c.sched.Observer())
	case retry.EmulatePerType, retry.EmulatePerStream:
		if kopts.NACKBackoff <= 0 {
			kopts.NACKBackoff = 5 * time.Second
		}
		b := &retry.Blocking{PerStream: kopts.Emulate == retry.EmulatePerStream, Backoff: kopts.NACKBackoff, Resender: kc}
		observers = append(observers, b.Observer())
	default:
		return nil, fmt.Errorf("emulate %q: want %s or %s", kopts.Emulate, retry.EmulatePerType, retry.EmulatePerStream)
	}
	if opts.OwnerCheck != nil {
		c.holds, err = owner.New(owner.Config{Mapping: kopts.OwnerMapping, Policy: opts.OwnerCheck, Timeout: opts.OwnerCheckTimeout,
			Source: kc, Inventory: c.zones, Refresher: kc, Hooks: kopts.OwnerHooks, Generation: kopts.OwnerGeneration})
		if err != nil {
			return nil, err
		}
		kc.UseViews(true) // a client sees what its owner checks published, nothing before
		observers = append(observers, c.holds.Observer())
	}
	c.tracker = engine.NewTracker(kc, observers...)
	if kopts.Emulate != "" {
		c.tracker.SetCallbacksStallStreams()
	}
	go c.expire()
	c.tracker.SetLimits(kopts.Limits)
	if !kopts.PlainNACKsMayPass {
		c.tracker.SetPlainCause(event.CauseInvalid)
	}
	return c, nil
}

// Close stops the client expiry, the owner checks, the retry decisions in flight and every
// stream's sender. A second Close does nothing.
func (c *Cache) Close() {
	c.closed.Do(func() {
		close(c.stop)
		if c.tracker != nil { // the expiry runs
			<-c.done
		}
		if c.holds != nil {
			c.holds.Close()
		}
		if c.sched != nil {
			c.sched.Close()
		}
		c.Cache.Close()
		c.refusals.Close()
	})
}

// SetSnapshot replaces what is served (kds-host's global builds its snapshots from its store;
// SetResources builds one from resources), and has the owner holds check what changed.
func (c *Cache) SetSnapshot(snap *engine.Snapshot) {
	if c.holds != nil {
		// A write of a few resources is decided first for the zones that ask the same, so that
		// the cache's one evaluation of each of their streams sends it.
		c.holds.Prepare(snap)
	}
	c.Cache.SetSnapshot(snap)
	if c.holds != nil {
		c.holds.Changed(snap)
	}
}

// expire frees, every quarter of the grace, the state of the clients whose last stream closed
// more than the grace ago, until Close.
func (c *Cache) expire() {
	defer close(c.done)
	tick := time.NewTicker(max(c.grace/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		for _, client := range c.zones.Expire(time.Now().Add(-c.grace)) {
			c.ForgetNode(client)
			if c.holds != nil {
				c.holds.Forget(client)
			}
			if c.forget != nil {
				c.forget(client)
			}
		}
	}
}

// Tracker, Zones, Retry and Holds are the parts kds-host's global reads: the delta server's
// callbacks, the zone table, the retry scheduler (nil when emulating) and the owner holds (nil
// without an owner check).
func (c *Cache) Tracker() *engine.Tracker { return c.tracker }
func (c *Cache) Zones() *engine.Nodes     { return c.zones }
func (c *Cache) Retry() *retry.Scheduler  { return c.sched }
func (c *Cache) Holds() *owner.Holds      { return c.holds }

// Callbacks returns the server callbacks the cache follows each stream with: pass them to
// server.NewServer. Each stream callback, SotW and delta, calls the cache's and then next's (may
// be nil).
func (c *Cache) Callbacks(next server.Callbacks) server.Callbacks {
	if next == nil {
		next = server.CallbackFuncs{}
	}
	return &cacheCallbacks{Callbacks: next, t: c.tracker}
}

type cacheCallbacks struct {
	server.Callbacks
	t *engine.Tracker
}

func (cb *cacheCallbacks) OnDeltaStreamOpen(ctx context.Context, id int64, typeURL string) error {
	if err := cb.t.OnDeltaStreamOpen(ctx, id, typeURL); err != nil {
		return err
	}
	return cb.Callbacks.OnDeltaStreamOpen(ctx, id, typeURL)
}

func (cb *cacheCallbacks) OnDeltaStreamClosed(id int64, node *core.Node) {
	cb.t.OnDeltaStreamClosed(id, node)
	cb.Callbacks.OnDeltaStreamClosed(id, node)
}

func (cb *cacheCallbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	if err := cb.t.OnStreamDeltaRequest(id, req); err != nil {
		return err
	}
	return cb.Callbacks.OnStreamDeltaRequest(id, req)
}

func (cb *cacheCallbacks) OnStreamDeltaResponse(id int64, req *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	cb.t.OnStreamDeltaResponse(id, req, resp)
	cb.Callbacks.OnStreamDeltaResponse(id, req, resp)
}

func (cb *cacheCallbacks) OnStreamOpen(ctx context.Context, id int64, typeURL string) error {
	if err := cb.t.OnStreamOpen(ctx, id, typeURL); err != nil {
		return err
	}
	return cb.Callbacks.OnStreamOpen(ctx, id, typeURL)
}

func (cb *cacheCallbacks) OnStreamClosed(id int64, node *core.Node) {
	cb.t.OnStreamClosed(id, node)
	cb.Callbacks.OnStreamClosed(id, node)
}

func (cb *cacheCallbacks) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	if err := cb.t.OnStreamRequest(id, req); err != nil {
		return err
	}
	return cb.Callbacks.OnStreamRequest(id, req)
}

func (cb *cacheCallbacks) OnStreamResponse(ctx context.Context, id int64, req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	cb.t.OnStreamResponse(ctx, id, req, resp)
	cb.Callbacks.OnStreamResponse(ctx, id, req, resp)
}

func (cb *cacheCallbacks) OnFetchRequest(ctx context.Context, req *discovery.DiscoveryRequest) error {
	return cb.t.OnFetchRequest(ctx, req)
}

// SetResources replaces what the cache serves: every resource of every type, by type URL. A
// resource's version is a digest of its content, so a client is sent only what changed. A type
// the cache was not made for, or a resource without a name, is refused, and nothing changes.
func (c *Cache) SetResources(resources map[string][]types.Resource) error {
	c.setMu.Lock()
	defer c.setMu.Unlock()
	built := make(map[string]map[string]*engine.Entry, len(resources))
	var entries []*engine.Entry
	for _, typeURL := range slices.Sorted(maps.Keys(resources)) {
		if !slices.Contains(c.types, typeURL) {
			return fmt.Errorf("guard: type %q is not one of the cache's (%v)", typeURL, c.types)
		}
		byName := map[string]*engine.Entry{}
		for _, r := range resources[typeURL] {
			e, err := c.entry(typeURL, r)
			if err != nil {
				return err
			}
			if _, dup := byName[e.Name]; dup {
				return fmt.Errorf("guard: %s %q given twice", shortType(typeURL), e.Name)
			}
			byName[e.Name] = e
			entries = append(entries, e)
		}
		built[typeURL] = byName
	}
	c.built = built
	c.SetSnapshot(engine.SnapshotOf(entries))
	return nil
}

// entry encodes one resource, or reuses the entry of its last version when its content is the
// same: its version is a digest of its encoding, as the wrapped caches' items are.
func (c *Cache) entry(typeURL string, r types.Resource) (*engine.Entry, error) {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, r, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, fmt.Errorf("guard: encode a %s: %w", shortType(typeURL), err)
	}
	name := cache.GetResourceName(r)
	if name == "" {
		return nil, fmt.Errorf("guard: a %s without a name", shortType(typeURL))
	}
	sum := sha256.Sum256(a.GetValue())
	version := hex.EncodeToString(sum[:12])
	if old := c.built[typeURL][name]; old != nil && old.Version == version {
		return old, nil
	}
	// The candidate the owner checks read (owner.Mapping's default): the kind is the type URL, the
	// owners what it references.
	env := &kdsv1.Resource{Kind: typeURL, Name: name}
	for _, ref := range c.owners(typeURL, r) {
		env.Owners = append(env.Owners, &kdsv1.ResourceKey{Kind: ref.TypeURL, Name: ref.Name})
	}
	e := &engine.Entry{TypeURL: typeURL, Name: name, Version: version, Any: a, Source: env,
		Wire: &discovery.Resource{Name: name, Version: version, Resource: a}}
	if err := e.EncodeWire(); err != nil { // once, for every client (the codec)
		return nil, fmt.Errorf("guard: encode a %s: %w", shortType(typeURL), err)
	}
	return e, nil
}

// counter counts NACKs and responses by type, and refused streams by reason, for the collector,
// and logs refused streams (a few lines a second per reason).
func (c *Cache) counter() event.Observer {
	return event.Observer{
		NACK: func(n event.NACK) { c.totals.add(&c.totals.nacks, n.TypeURL) },
		Sent: func(s event.Sent) { c.totals.add(&c.totals.responses, s.TypeURL) },
		Refused: func(r event.Refusal) {
			c.totals.add(&c.totals.refusals, r.Reason)
			c.refusals.Log(r.Reason, hclog.Warn, "xDS stream refused", "reason", r.Reason, "node", r.Node, "detail", r.Detail)
		},
	}
}

// Clients returns every connected client's insight, by node id (one stream each: a client's
// newer stream replaces its older one).
func (c *Cache) Clients() []ClientInsight {
	out := []ClientInsight{}
	for _, z := range c.zones.Insights() {
		if !z.Connected {
			continue
		}
		ci := ClientInsight{Stream: z.Stream, Delta: true, Node: z.Node}
		held := map[string][]Withheld{}
		if c.holds != nil {
			for _, w := range c.holds.Withheld(z.Node) {
				reason := w.Verdict + ": " + w.Reason
				if w.WaitingFor != (engine.Ref{}) {
					reason = w.Verdict + ": waiting for " + w.WaitingFor.TypeURL + "/" + w.WaitingFor.Name
				}
				held[w.Key.TypeURL] = append(held[w.Key.TypeURL], Withheld{Name: w.Key.Name, Reason: reason})
			}
		}
		for _, k := range z.Types {
			ti := &TypeInsight{TypeURL: k.TypeURL, Responses: k.Responses, ACKs: k.ACKs, NACKs: k.NACKs, LastError: k.LastError, Withheld: held[k.TypeURL]}
			for _, r := range k.Rejected {
				ti.Withheld = append(ti.Withheld, Withheld{Name: r.Name, Version: r.Version, Reason: "refused by the client: " + r.Reason})
			}
			ci.Types = append(ci.Types, ti)
		}
		out = append(out, ci)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}
