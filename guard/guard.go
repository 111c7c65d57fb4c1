// Package guard puts kds-host's NACK handling in front of any go-control-plane v0.14 xDS server:
// it wraps the server's own cache (SnapshotCache, LinearCache, MuxCache, any cache.Cache) and
// composes with the server's own callbacks, so that a client's NACK never makes the server send
// the refused version again and again, and a resource waits for what it references.
//
// It supports go-control-plane v0.14.0, the version this module builds and tests against: the
// guard relies on its cache.Cache, Subscription and server callback contracts. Adopting it is
// three lines:
//
//	g, err := guard.New(snapshotCache, guard.Options{})
//	defer g.Close()
//	srv := server.NewServer(ctx, g, g.Callbacks(myCallbacks))
//
// How the wrapping works: the guard serves the server's watches from kds-host's engine, the one
// NewCache serves from, and fills the engine from the wrapped cache. For each node and type a
// client asks for, the guard keeps one watch of its own on the wrapped cache for every resource
// of the type (a wildcard request, whatever names the client asked for; one for every node when
// the cache answers every node alike, Options.NodeIndependent), and the cache's answers make the
// node's snapshot (or the one every node shares). Each stream is answered with what its client
// should see of it: the names it subscribed, each at the version the cache serves, except
//   - a version the client refused (NACKed): the client keeps the version it last accepted (sent
//     again, or left out if it has none), until the retry policy resends it or its content
//     changes;
//   - a resource that references what the client has not accepted (Options.Owners, by default
//     EnvoyReferences: a route whose cluster the client refused, a listener whose route
//     configuration it has not got): the client keeps the version it has, until what it
//     references is accepted (make-before-break; Options.NoHolds turns this off);
//   - a resource the cache no longer serves that something the client holds still references:
//     kept until the client holds what no longer references it.
//   - with Options.OwnerCheck, a version the kds-host OwnerCheck plugin has not accepted for
//     this client (WAIT or REJECT, with the plugin's reason).
//
// On a NACK the guard records which resources were refused: by name where the client's message
// names them (grpc-go's `resource "NAME": ...`, Envoy's `... NAME: ...`), else every resource the
// response brought new. It asks the retry policy (kds-host's RetryForcer: the built-in one, or a
// plugin) for a schedule, off the stream's goroutine, and resends what the schedule names; the
// xDS callbacks never wait. A client's NACK is about content (neither Envoy nor grpc-go has a
// transient cause), so refusals count as INVALID: the built-in policy resends a refused version
// three times with backoff, then parks it until its content changes.
//
// Or it serves from kds-host's own cache (NewCache), for a server that sets its resources itself
// (SetResources): the engine kds-host's global serves its zones from. A write costs only the
// streams that hold what changed, one encoding of a version is shared by every stream, and each
// stream's one sender never blocks on the server's channel whatever its types (go-control-plane
// issue 875). It serves both servers, and holds back only what the owner check says
// (Options.OwnerCheck, with Options.Owners as the owners). Both modes share the options, the
// plugins (Options.Plugins), the NACK reading, the retry decisions and the insight.
//
// What one client stream asks for is bounded (Options.MaxTypesPerStream, MaxNamesPerStream,
// MaxStreamsPerNode): a request past a bound is refused with ResourceExhausted, and counted,
// before the server stores any of it.
//
// Supported: go-control-plane v0.14's two servers, state of the world and delta, ADS and the
// per-type services: a delta client gets what changed of the same view, a refused name going
// back to what it kept. The wrapped cache is always watched the state-of-the-world way (every
// resource of a type), whichever server the client talks to. A SotW client of a type other than
// Listeners and Clusters gets what changed, as go-control-plane's caches send it (the whole view
// first, and again when it asks for other names). Such a cache does not tell a SotW watch of
// such a type that a resource was removed until something else of the type changes, so a delta
// client hears of that removal then. Clients: Envoy and grpc-go's xDS client, or any xDS client.
package guard

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
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
	bounds bounds

	// shared: one feed for every node (Options.NodeIndependent, or a LinearCache), its
	// snapshot the engine's global one; else a feed per node, its snapshot the node's.
	shared bool

	mu      sync.Mutex          // guards streams, feeds and stopped; released before a feed's lock is taken
	streams map[int64]*followed // by the engine's stream id (a SotW stream's negated)
	feeds   map[string]*feed    // by node id ("" when shared), while a stream of it is open
	perNode map[string]int      // open streams of each node, once their first request named it
	stopped bool                // Close stopped the feeds: none starts again
	running sync.WaitGroup      // the feeds' watches
}

// followed is what the guard knows of one stream: what its requests asked for (bounds) and the
// feed of its node, once its first request named the node.
type followed struct {
	asked
	node string
	feed *feed
	key  string // the engine's node of the stream (streamKey)
}

// wellKnown are the xDS types the engine is made for, in the order responses ready together go
// (what others reference first); any other type URL is served after them.
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
	if err := opts.checkInner(inner); err != nil {
		return nil, err
	}
	if opts.Owners == nil {
		opts.Owners = EnvoyReferences
	}
	b := opts.bounds()
	var g *Guard
	if check := opts.OwnerCheck; check != nil {
		opts.OwnerCheck = func() shared.OwnerCheck { return askedOwners{check(), g} }
	}
	// Each stream is the engine's node of its own (streamKey): a node's streams are served side
	// by side, bounded by MaxStreamsPerNode, not replaced.
	v, err := newServing(wellKnown, &opts, engine.Limits{MaxNodes: 1 << 30, MaxNodeIDLength: maxNodeKey, MaxUnknownNames: b.names})
	if err != nil {
		return nil, err
	}
	_, linear := inner.(*cache.LinearCache)
	g = &Guard{serving: v, inner: inner, opts: opts, items: newItemCache(), bounds: b, shared: opts.NodeIndependent || linear,
		streams: map[int64]*followed{}, feeds: map[string]*feed{}, perNode: map[string]int{}}
	v.s.Cache.ServeAnyType()
	v.s.Tracker.SetNodeKey(streamKey)
	if g.shared {
		v.s.SetSnapshot(engine.SnapshotOf(nil).Declare()) // no type answered yet
	} else {
		v.s.Cache.UseNodeSnapshots()
	}
	v.before, v.checkWording = g.stopFeeds, true
	return g, nil
}

// askedOwners is an OwnerCheck whose candidates wait only for the owners their client asks for,
// as the guard's own holds wait: a cluster does not wait for endpoints a client asks for only
// once it has the cluster.
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

// maxNodeKey bounds a node id and its stream id, as the engine's node (streamKey): the request's
// size (gRPC's receive limit) bounds a node id.
const maxNodeKey = 64 << 10

// streamKey is the engine's node of a stream: its node id and the engine's stream id.
func streamKey(id int64, node string) string { return node + "\x00" + strconv.FormatInt(id, 10) }

// Clients returns every open client stream's insight, by stream (SotW streams first).
func (g *Guard) Clients() []ClientInsight {
	out := g.clients(func(key string, id int64) ClientInsight {
		node, _, _ := strings.Cut(key, "\x00")
		if id < 0 {
			return ClientInsight{Stream: -id, Node: node}
		}
		return ClientInsight{Stream: id, Delta: true, Node: node}
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
	return &callbacks{Callbacks: g.s.Callbacks(next), passFetch: passFetch{next}, g: g}
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
	var last *feed
	if st != nil && st.feed != nil {
		if g.perNode[st.node]--; g.perNode[st.node] == 0 {
			delete(g.perNode, st.node)
		}
		if st.feed.streams--; st.feed.streams == 0 {
			last = st.feed
			if g.feeds[last.id] == last {
				delete(g.feeds, last.id)
			}
		}
	}
	g.mu.Unlock()
	if st == nil || st.feed == nil {
		return
	}
	st.feed.leave(st.key)
	if last != nil {
		last.stop()
	}
}

// request admits a request of stream id (the engine's) within the stream's bounds, and has its
// node's feed watch the wrapped cache for its type.
// It reports whether the stream is followed (open).
func (g *Guard) request(id int64, r request) (bool, error) {
	g.mu.Lock()
	st := g.streams[id]
	if st == nil {
		g.mu.Unlock()
		return false, nil
	}
	if st.feed == nil {
		nid := r.node.GetId()
		if err := g.admitNode(nid); err != nil {
			g.mu.Unlock()
			g.refused("limit", truncate(nid), err)
			return true, err
		}
		fid := nid
		if g.shared {
			fid = ""
		}
		f := g.feeds[fid]
		if f == nil {
			f = &feed{g: g, id: fid, node: r.node, done: make(chan struct{}), types: map[string]*fed{}, keys: map[string]bool{}}
			f.snap = engine.SnapshotOf(nil).Declare() // no type answered yet
			if g.shared {
				f.snap = g.s.Cache.Snapshot()
			}
			g.feeds[fid] = f
		}
		f.streams++
		g.perNode[nid]++
		st.node, st.feed, st.key = nid, f, streamKey(id, nid)
		defer st.feed.join(st.key)
	}
	err := st.admitNames(g.bounds, r)
	f := st.feed
	g.mu.Unlock()
	if err != nil {
		g.refused("limit", truncate(st.node), err)
		return true, err
	}
	f.watch(r.typeURL)
	return true, nil
}

// wildcard is the request the guard makes of the wrapped cache for a type: every resource,
// newer than version. returned is what the cache's last answer returned (its
// ReturnedResources): a cache that compares it with what it serves (SnapshotCache does) would
// otherwise answer again at once, forever.
func wildcard(node *core.Node, typeURL, version string, returned map[string]string) (*discovery.DiscoveryRequest, cache.Subscription) {
	sub := stream.NewSotwSubscription(nil, true)
	if returned != nil {
		sub.SetReturnedResources(returned)
	}
	return &discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL, VersionInfo: version}, &sub
}
