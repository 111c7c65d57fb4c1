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
// How the wrapping works: the server asks the guard for watches, as it would ask its cache. For
// each client stream and type, the guard keeps one watch of its own on the wrapped cache for
// every resource of the type (a wildcard request, whatever names the client asked for; one for
// every stream of the type when the cache answers every node alike, Options.NodeIndependent), and
// answers the server's watch with what this client should see of it: the names it subscribed,
// each at the version the cache serves, except
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
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/internal/lograte"
	"github.com/kds-host/kds-host/internal/stack"
	"github.com/kds-host/kds-host/policy"
)

// Guard is a cache.Cache that guards the wrapped one. Use Callbacks as the server's callbacks.
type Guard struct {
	inner cache.Cache
	opts  Options
	sched *retry.Scheduler
	obs   event.Observer  // the scheduler's
	rt    *policy.Runtime // Options.Plugins'; nil without
	descs descs
	log   *slog.Logger
	items *itemCache

	nodeIndependent bool             // one watch of the wrapped cache per type (feeds), not one per stream and type
	feedsMu         sync.Mutex       // guards feeds and feedsStopped
	feeds           map[string]*feed // by type URL, while a stream asks for the type
	feedsStopped    bool             // Close stopped them: no feed starts again
	feedsRun        sync.WaitGroup   // the feeds' goroutines

	badMu     sync.Mutex          // guards badLogged
	badLogged map[string]struct{} // the bad resources logged (logBad)

	ownerAbandoned policy.Abandoned // the owner check's calls given up at their deadline that still run

	totals   totals
	shares   shares       // the shared served's resources, for the codec
	bounds   bounds       // Options' bounds (bounds.go)
	refusals *lograte.Log // refused streams, a few lines a second per reason

	mu            sync.Mutex                                    // guards nodes, streams, requests, deltaRequests, and each session's bound
	nodes         map[string]int                                // open streams by node id, counted by admit
	streams       map[int64]*session                            // by the guard's id (deltaID for delta streams)
	requests      map[*discovery.DiscoveryRequest]*session      // bound by OnStreamRequest, taken by CreateWatch
	deltaRequests map[*discovery.DeltaDiscoveryRequest]*session // bound by OnStreamDeltaRequest, taken by CreateDeltaWatch
}

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
	rt, err := opts.openPlugins()
	if err != nil {
		return nil, err
	}
	_, linear := inner.(*cache.LinearCache)
	g := &Guard{inner: inner, opts: opts, log: opts.Logger, items: newItemCache(), rt: rt, descs: opts.descs(),
		nodeIndependent: opts.NodeIndependent || linear, feeds: map[string]*feed{}, badLogged: map[string]struct{}{},
		bounds: opts.bounds(), nodes: map[string]int{}, refusals: lograte.New(opts.Logger, time.Second, refusalLines, "reason"),
		streams: map[int64]*session{}, requests: map[*discovery.DiscoveryRequest]*session{},
		deltaRequests: map[*discovery.DeltaDiscoveryRequest]*session{}}
	sched, err := stack.NewScheduler(opts.RetryPolicy, opts.Fallback, retry.StandardConfig{Timeout: opts.PolicyTimeout}, stack.LoggingHooks(opts.Logger, retry.Hooks{}),
		func(id int64) retry.Session {
			if s := g.session(id); s != nil {
				return s
			}
			return nil // not a typed nil
		})
	if err != nil {
		if rt != nil {
			rt.Close()
		}
		return nil, err
	}
	g.sched, g.obs = sched, sched.Observer()
	return g, nil
}

// Close stops every stream's work and the retry decisions in flight.
func (g *Guard) Close() {
	g.sched.Close()
	g.mu.Lock()
	streams := make([]*session, 0, len(g.streams))
	for _, s := range g.streams {
		streams = append(streams, s)
	}
	g.mu.Unlock()
	for _, s := range streams {
		g.closeStream(s.id)
	}
	g.stopFeeds()
	g.refusals.Close()
	if g.rt != nil {
		g.rt.Close()
	}
}

func (g *Guard) owners(typeURL string, r Resource) []Ref { return g.opts.Owners(typeURL, r) }

// errWrongCount is an OwnerCheck answer without one prediction per candidate.
var errWrongCount = errors.New("the owner check answered another number of predictions than it was asked")

func (g *Guard) session(id int64) *session {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.streams[id]
}

// CreateWatch implements cache.ConfigWatcher for the state-of-the-world server.
func (g *Guard) CreateWatch(req *discovery.DiscoveryRequest, sub cache.Subscription, out chan cache.Response) (func(), error) {
	s, err := take(g, g.requests, req)
	if err != nil {
		return nil, err
	}
	return s.watch(&watch{req: req, out: out, sub: sub}, req.GetTypeUrl(), req.GetNode())
}

// Fetch implements cache.ConfigFetcher (REST): the wrapped cache's answer.
func (g *Guard) Fetch(ctx context.Context, req *discovery.DiscoveryRequest) (cache.Response, error) {
	return g.inner.Fetch(ctx, req)
}

// openStream starts a stream's session (id: the guard's, see deltaID).
func (g *Guard) openStream(id int64, delta bool) {
	s := newSession(g, id, delta)
	g.mu.Lock()
	g.streams[id] = s
	g.mu.Unlock()
	go s.run()
}

// closeStream stops a stream's session and cancels its watches of the wrapped cache.
func (g *Guard) closeStream(id int64) {
	g.mu.Lock()
	s := g.streams[id]
	delete(g.streams, id)
	if s != nil {
		for _, req := range s.bound {
			unbind(g, req) // bound, but its watch never came
		}
	}
	g.mu.Unlock()
	if s != nil {
		g.uncount(s)
		s.close()
	}
}

// take finds the session a request was bound to by the callbacks, for its watch.
func take[R any](g *Guard, bound map[*R]*session, req *R) (*session, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := bound[req]
	delete(bound, req)
	if !ok {
		// A server that does not call the guard's callbacks: nothing to guard with.
		err := status.Error(codes.FailedPrecondition, "the request was not seen by the guard's callbacks: the server must be made with them (server.NewServer(ctx, guard, guard.Callbacks(yours)))")
		g.totals.add(&g.totals.refusals, "unbound")
		g.refusals.Log("unbound", slog.LevelError, "xDS request refused: the server was made without the guard's Callbacks", "error", err)
		return nil, err
	}
	return s, nil
}

// bind binds a request to its session, for take, and forgets the session's previous request of
// the type (a stale one the server skipped: its watch never came).
func bind[R any](g *Guard, bound map[*R]*session, s *session, typeURL string, req *R) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if old := s.bound[typeURL]; old != nil {
		unbind(g, old)
	}
	s.bound[typeURL] = req
	bound[req] = s
}

// unbind forgets a request bound for its watch. Call with g.mu.
func unbind(g *Guard, req any) {
	switch r := req.(type) {
	case *discovery.DiscoveryRequest:
		delete(g.requests, r)
	case *discovery.DeltaDiscoveryRequest:
		delete(g.deltaRequests, r)
	}
}

// wildcard is the request the guard makes of the wrapped cache for a type: every resource,
// newer than version. returned is what the cache's last answer returned (its
// ReturnedResources): a cache that compares it with what it serves (SnapshotCache does) would
// otherwise answer again at once, forever.
func wildcard(req *discovery.DiscoveryRequest, version string, returned map[string]string) (*discovery.DiscoveryRequest, cache.Subscription) {
	sub := stream.NewSotwSubscription(nil, true)
	if returned != nil {
		sub.SetReturnedResources(returned)
	}
	return &discovery.DiscoveryRequest{Node: req.GetNode(), TypeUrl: req.GetTypeUrl(), VersionInfo: version}, &sub
}
