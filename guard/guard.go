// Package guard puts kds-host's NACK handling in front of any go-control-plane v0.14 xDS server,
// SotW and delta (docs/go-control-plane.md). New wraps the server's own cache (any cache.Cache)
// and composes with its callbacks; NewCache is kds-host's own cache, for a server that sets its
// resources itself.
//
//	g, err := guard.New(snapshotCache, guard.Options{})
//	defer g.Close()
//	srv := server.NewServer(ctx, g, g.Callbacks(myCallbacks))
//
// Each stream gets the names it subscribed at the version the wrapped cache serves, except:
//   - a version the client refused (NACKed): it keeps the version it last accepted, until the
//     retry policy resends the refused one or its content changes;
//   - a resource that references what the client has not accepted (Options.Owners): it keeps the
//     version it has until what it references is accepted (Options.NoHolds turns this off);
//   - a removed resource that something the client holds still references: kept until then;
//   - with Options.OwnerCheck, a version the OwnerCheck policy has not accepted for the client.
//
// A stream's requests are bounded (Options.MaxTypesPerStream, MaxNamesPerStream,
// MaxStreamsPerNode): past a bound, refused with ResourceExhausted.
package guard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kds-host/kds-host/engine"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// Guard is a cache.Cache that guards the wrapped one. Use Callbacks as the server's callbacks.
type Guard struct {
	*serving
	inner  cache.Cache
	opts   Options
	items  *itemCache
	pool   *snapPool // the nodes' snapshots (per-node caches)
	bounds bounds
	shared bool            // one feed for every node, its snapshot the engine's global one (NodeIndependent, a LinearCache, or mux)
	mux    *cache.MuxCache // inner, shared as a MuxCache of LinearCaches without options that say how it answers (nil if not)

	mu      sync.Mutex          // guards streams, feeds, stopped and watches; released before a feed's lock is taken
	streams map[int64]*followed // by the engine's stream id (a SotW stream's negated)
	feeds   map[string]*feed    // by node id (Options.NodeHash's ID; "" when shared), while a stream of it is open
	perNode map[string]int      // open streams of each node, once their first request named it
	stopped bool                // Close stopped the feeds: none starts again
	watches *watcher            // the feeds' watches, from the first (nil until then)
}

// followed is one stream: what its requests asked for, and its node's feed once it named it.
type followed struct {
	asked
	node  string
	named *core.Node // the node its first request named
	feed  *feed
	key   string // the engine's node of the stream (streamKey)
}

// wellKnown are the xDS types in the order responses ready together go; others go after them.
var wellKnown = []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType,
	resource.ScopedRouteType, resource.VirtualHostType, resource.SecretType, resource.RuntimeType,
	resource.ExtensionConfigType, resource.RateLimitConfigType}

// New wraps inner. Its errors name the option at fault.
func New(inner cache.Cache, opts Options) (_ *Guard, err error) {
	if inner == nil {
		return nil, errors.New("guard: a cache to wrap is required")
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	if _, byNode := inner.(cache.SnapshotCache); byNode && opts.NodeIndependent {
		return nil, errors.New("guard: Options.NodeIndependent over a SnapshotCache: it answers each node with its own snapshot, and one shared watch would serve one node's resources to every other; leave NodeIndependent false")
	}
	if opts.Owners == nil {
		opts.Owners = EnvoyReferences
	}
	b := opts.bounds()
	var g *Guard
	if check := opts.OwnerCheck; check != nil {
		opts.OwnerCheck = func() shared.OwnerCheck { return askedOwners{check(), g} }
	}
	// Each stream is an engine node of its own (streamKey), bounded by MaxStreamsPerNode.
	v, err := newServing(wellKnown, &opts, engine.Limits{MaxNodes: 1 << 30, MaxNodeIDLength: maxNodeKey, MaxUnknownNames: b.names})
	if err != nil {
		return nil, err
	}
	_, linear := inner.(*cache.LinearCache)
	mux := linearMux(inner, opts)
	g = &Guard{serving: v, inner: inner, opts: opts, items: newItemCache(), pool: &snapPool{by: map[uint64][]*pooled{}, steps: map[*pooled][]step{}}, bounds: b,
		shared: opts.NodeIndependent || linear || mux != nil, mux: mux, streams: map[int64]*followed{}, feeds: map[string]*feed{}, perNode: map[string]int{}}
	v.s.Cache.ServeAnyType()
	v.s.Tracker.SetNodeKey(streamKey)
	if g.shared {
		v.s.SetSnapshot(engine.SnapshotOf(nil).Declare()) // no type answered yet
	} else {
		v.s.Cache.UseNodeSnapshots()
	}
	v.before, v.checkWording, v.list = g.stopFeeds, true, g.Clients
	return g, nil
}

// linearMux is inner if it is a MuxCache of LinearCaches (they answer every node alike) and
// opts do not say how it answers; nil if not.
func linearMux(inner cache.Cache, opts Options) *cache.MuxCache {
	m, ok := inner.(*cache.MuxCache)
	if !ok || opts.NodeHash != nil || opts.NodeIndependent || m.Classify == nil || len(m.Caches) == 0 {
		return nil
	}
	for _, c := range m.Caches {
		if _, ok := c.(*cache.LinearCache); !ok {
			return nil
		}
	}
	return m
}

// sameRoute refuses a stream of node that the shared MuxCache routes typeURL of elsewhere than
// of watched, the node the shared watch is made for (as it does if Classify panics).
func (g *Guard) sameRoute(watched, node *core.Node, typeURL string) error {
	key := func(n *core.Node) (k string, ok bool) {
		defer func() {
			if p := recover(); p != nil {
				k = fmt.Sprintf("a panic: %v", p)
			}
		}()
		return g.mux.Classify(&cache.Request{Node: n, TypeUrl: typeURL}), true
	}
	want, wok := key(watched)
	got, ok := key(node)
	if wok && ok && want == got {
		return nil
	}
	return status.Errorf(codes.FailedPrecondition, "the MuxCache routes type %s of node %q to %q and of node %q to %q, and the guard shares one watch of a "+
		"MuxCache of LinearCaches among all nodes: give guard.New Options.NodeHash (cache.IDHash{}: a watch per node)",
		truncate(typeURL), truncate(watched.GetId()), truncate(want), truncate(node.GetId()), truncate(got))
}

// askedOwners is an OwnerCheck whose candidates wait only for the owners their client asks for.
type askedOwners struct {
	shared.OwnerCheck
	g *Guard
}

func (a askedOwners) Predict(ctx context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	st := a.g.s.Cache.Current(req.GetZone())
	out := proto.CloneOf(req)
	for _, c := range out.GetCandidates() {
		c.Owners = slices.DeleteFunc(c.Owners, func(o *kdsv1.ResourceKey) bool {
			return st == nil || !st.Asks(o.GetKind(), o.GetName())
		})
	}
	return a.OwnerCheck.Predict(ctx, out)
}

// maxNodeKey bounds a stream's engine node (streamKey); gRPC's receive limit bounds a node id.
const maxNodeKey = 64 << 10

// streamKey is the engine's node of a stream: its node id and the engine's stream id.
func streamKey(id int64, node string) string { return node + "\x00" + strconv.FormatInt(id, 10) }

// Clients returns every open client stream's insight, by stream (SotW streams first).
func (g *Guard) Clients() []ClientInsight {
	out := g.clients(func(key string, id int64) ClientInsight {
		node, _, _ := strings.Cut(key, "\x00")
		return ClientInsight{Stream: max(id, -id), Delta: id >= 0, Node: node}
	})
	slices.SortFunc(out, func(a, b ClientInsight) int {
		if a.Delta != b.Delta {
			if a.Delta {
				return 1 // SotW streams first
			}
			return -1
		}
		return cmp.Compare(a.Stream, b.Stream)
	})
	return out
}

// Fetch implements cache.ConfigFetcher (REST): the wrapped cache's answer.
func (g *Guard) Fetch(ctx context.Context, req *discovery.DiscoveryRequest) (cache.Response, error) {
	return g.inner.Fetch(ctx, req)
}

// Callbacks returns the server callbacks that let the guard follow each stream: pass them to
// server.NewServer. Each calls the guard's and then next's (may be nil), so the server's own
// callbacks keep working; an error from next ends the stream, as it would without the guard.
func (g *Guard) Callbacks(next server.Callbacks) server.Callbacks {
	if next == nil {
		next = server.CallbackFuncs{}
	}
	return &callbacks{Callbacks: g.s.Callbacks(next), next: next, g: g}
}

// opened follows a new stream (id: the engine's).
func (g *Guard) opened(id int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.streams[id] = &followed{}
}

// closed stops following a stream, and stops its node's feed if it was the node's last stream.
func (g *Guard) closed(id int64) {
	g.mu.Lock()
	st := g.streams[id]
	delete(g.streams, id)
	if st == nil || st.feed == nil {
		g.mu.Unlock()
		return
	}
	if g.perNode[st.node]--; g.perNode[st.node] == 0 {
		delete(g.perNode, st.node)
	}
	f := st.feed
	f.streams--
	last := f.streams == 0
	if last && g.feeds[f.id] == f {
		delete(g.feeds, f.id)
	}
	g.mu.Unlock()
	f.leave(st.key)
	if last {
		f.stop()
	}
}

// request admits a request of stream id (the engine's) within the stream's bounds (and a shared
// MuxCache's route, sameRoute), and has its node's feed watch the wrapped cache for its type. It
// reports whether the stream is followed.
func (g *Guard) request(id int64, r request) (bool, error) {
	g.mu.Lock()
	st := g.streams[id]
	if st == nil {
		g.mu.Unlock()
		return false, nil
	}
	node := st.node
	var err error
	if st.feed == nil {
		node = r.node.GetId()
		if err = g.admitNode(node); err == nil {
			st.node, st.named, st.feed, st.key = node, r.node, g.feedOf(r.node), streamKey(id, node)
			defer st.feed.join(st.key)
		}
	}
	first := g.mux != nil && st.types[r.typeURL] == nil // sameRoute's: the stream's first request of the type
	if err == nil {
		err = st.admitNames(g.bounds, r)
	}
	f, named := st.feed, st.named
	g.mu.Unlock()
	reason := "limit"
	if err == nil && first {
		err, reason = g.sameRoute(f.node, named, r.typeURL), "invalid"
	}
	if err != nil {
		g.refused(reason, truncate(node), status.Convert(err).Message())
		return true, err
	}
	f.watch(r.typeURL)
	return true, nil
}

// feedOf is the feed of node (of every node, when shared), made if none runs, with one more
// stream. Call with g.mu.
func (g *Guard) feedOf(node *core.Node) *feed {
	id := node.GetId()
	switch {
	case g.shared:
		id = ""
	case g.opts.NodeHash != nil:
		id = g.opts.NodeHash.ID(node)
	}
	f := g.feeds[id]
	if f == nil {
		f = &feed{g: g, id: id, node: node, types: map[string]map[string]string{}, watches: map[string]*feedWatch{}, keys: map[string]bool{}}
		f.snap = engine.SnapshotOf(nil).Declare() // no type answered yet
		if g.shared {
			f.snap = g.s.Cache.Snapshot()
		}
		g.feeds[id] = f
	}
	f.streams++
	return f
}

// callbacks are New's: each stream callback checks the stream's bounds and feeds its node's
// snapshot, then calls the engine's and next's (Callbacks, the stack's composed with next); the
// REST callbacks are next's. The engine numbers a SotW stream -id, a delta stream id.
type callbacks struct {
	server.Callbacks
	next server.Callbacks
	g    *Guard
}

func (c *callbacks) OnFetchRequest(ctx context.Context, req *discovery.DiscoveryRequest) error {
	return c.next.OnFetchRequest(ctx, req)
}

func (c *callbacks) OnStreamOpen(ctx context.Context, id int64, typeURL string) error {
	c.g.opened(-id)
	return c.Callbacks.OnStreamOpen(ctx, id, typeURL)
}

func (c *callbacks) OnStreamClosed(id int64, node *core.Node) {
	c.Callbacks.OnStreamClosed(id, node)
	c.g.closed(-id)
}

// OnStreamRequest refuses a request past the stream's bounds before the server stores any of it;
// a stream the guard was not told of is next's alone.
func (c *callbacks) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	followed, err := c.g.request(-id, request{node: req.GetNode(), typeURL: req.GetTypeUrl(), subscribe: req.GetResourceNames(), sotw: true})
	switch {
	case err != nil:
		return err
	case !followed:
		return c.next.OnStreamRequest(id, req)
	}
	return c.Callbacks.OnStreamRequest(id, req)
}

func (c *callbacks) OnDeltaStreamOpen(ctx context.Context, id int64, typeURL string) error {
	c.g.opened(id)
	return c.Callbacks.OnDeltaStreamOpen(ctx, id, typeURL)
}

func (c *callbacks) OnDeltaStreamClosed(id int64, node *core.Node) {
	c.Callbacks.OnDeltaStreamClosed(id, node)
	c.g.closed(id)
}

// OnStreamDeltaRequest is OnStreamRequest for a delta stream.
func (c *callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	followed, err := c.g.request(id, request{node: req.GetNode(), typeURL: req.GetTypeUrl(), subscribe: req.GetResourceNamesSubscribe(),
		unsubscribe: req.GetResourceNamesUnsubscribe(), initial: req.GetInitialResourceVersions()})
	switch {
	case err != nil:
		return err
	case !followed:
		return c.next.OnStreamDeltaRequest(id, req)
	}
	return c.Callbacks.OnStreamDeltaRequest(id, req)
}
