package guard

// What the wrapped cache serves of a type, and the one watch of it that every stream shares when
// the cache answers every node alike.

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// served is what the wrapped cache serves of one type, as a watch of it last heard: the
// answer's version, what the cache says the watch was returned, and the items, by name and
// sorted by name. A served that streams share (a feed's) never changes: the next answer makes
// another.
type served struct {
	version  string
	returned map[string]string
	byName   map[string]*item
	sorted   []*item

	// A shared served's only: sorted's resources in its order as each protocol's response
	// carries them, for a response of them all (whole), shared by every stream's; and their
	// encoding end to end, made the first time the codec writes such a response.
	anys              []*anypb.Any
	wires             []*discovery.Resource
	sotwRun, deltaRun run

	// A shared served's only: the names of its items by what they reference, in name order,
	// made the first time a holding of it is asked (referrers).
	byRefOnce sync.Once
	byRef     map[Ref][]string
}

// referrers are the names of the items of a shared served that reference ref, in name order.
// A nil served has none.
func (sv *served) referrers(ref Ref) []string {
	if sv == nil {
		return nil
	}
	sv.byRefOnce.Do(func() {
		sv.byRef = map[Ref][]string{}
		for _, it := range sv.sorted { // in name order, so each list is too
			for _, r := range it.refs {
				if names := sv.byRef[r]; len(names) == 0 || names[len(names)-1] != it.name {
					sv.byRef[r] = append(names, it.name)
				}
			}
		}
	})
	return sv.byRef[ref]
}

// get is the item served under name, or nil (nothing served yet included).
func (sv *served) get(name string) *item {
	if sv == nil {
		return nil
	}
	return sv.byName[name]
}

// all are the items served, sorted by name (none before the first answer).
func (sv *served) all() []*item {
	if sv == nil {
		return nil
	}
	return sv.sorted
}

// fold is what is served after the wrapped cache's answer for typeURL (its items, version and
// returned resources) on top of sv (nil before the first answer). inPlace reuses sv's map and
// order (a stream's own served); else sv is left as it is (a feed's, which streams read).
func (sv *served) fold(typeURL string, answered []*item, version string, returned map[string]string, inPlace bool) *served {
	next := &served{version: version, returned: returned}
	// A type whose SotW response is not the whole state (all but Listeners and Clusters):
	// go-control-plane's caches send what changed since what the watch was returned. What is
	// served is what was, changed by this answer, less what the cache no longer returns (named
	// as the cache names it: a cache that names a resource otherwise than cache.GetResourceName
	// does cannot say it removed it).
	partial := sv != nil && !fullState(typeURL) && returned != nil
	same := sv != nil // the names are sv's: its order holds, with new versions put in place
	switch {
	case partial && inPlace:
		next.byName = sv.byName
	case partial:
		next.byName = maps.Clone(sv.byName)
	default:
		next.byName = make(map[string]*item, len(answered))
		same = same && len(answered) == len(sv.byName)
	}
	if partial {
		for n := range sv.returned {
			if _, ok := returned[n]; !ok && next.byName[n] != nil {
				delete(next.byName, n)
				same = false
			}
		}
	}
	for _, it := range answered {
		if sv.get(it.name) == nil {
			same = false
		}
		next.byName[it.name] = it
	}
	if !same || len(next.byName) != len(sv.sorted) { // an answer that names a resource twice
		next.sorted = slices.SortedFunc(maps.Values(next.byName), byItemName)
	} else {
		next.sorted = sv.sorted
		if !inPlace {
			next.sorted = slices.Clone(sv.sorted)
		}
		for _, it := range answered {
			i, _ := slices.BinarySearchFunc(next.sorted, it.name, itemNamed)
			next.sorted[i] = next.byName[it.name]
		}
	}
	if !inPlace {
		next.anys = make([]*anypb.Any, len(next.sorted))
		next.wires = make([]*discovery.Resource, len(next.sorted))
		for i, it := range next.sorted {
			next.anys[i], next.wires[i] = it.any, it.resource()
		}
	}
	return next
}

// holdsAll reports whether items, a view, are every item a shared served holds, in order: the
// view is then sorted itself, the same for every stream.
func (sv *served) holdsAll(items []*item) bool {
	return sv.anys != nil && slices.Equal(items, sv.sorted)
}

// whole reports whether items are everything served, in order, as a shared served holds them
// (sorted itself): a response of them is then the same for every stream.
func (sv *served) whole(items []*item) bool {
	return sv.anys != nil && len(items) == len(sv.sorted) && (len(items) == 0 || &items[0] == &sv.sorted[0])
}

// answer reads an answer of the wrapped cache: its encoded response, and its resources as items,
// each read once whatever the streams that get it (a resource that cannot be encoded or read is
// logged and left out).
func (g *Guard) answer(r cache.Response) (*discovery.DiscoveryResponse, []*item, error) {
	resp, err := r.GetDiscoveryResponse()
	var raw []types.ResourceWithTTL
	if err == nil {
		raw = rawResources(r, len(resp.GetResources()))
	} else if resp, raw, err = g.encodeEach(r, err); err != nil {
		return nil, nil, err
	}
	typeURL := r.GetRequest().GetTypeUrl()
	answered := make([]*item, 0, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		var m Resource
		if raw != nil {
			m = raw[i].Resource
		}
		it, err := g.items.of(typeURL, a, m, g.owners)
		if err != nil {
			g.logBad(typeURL+"@"+resp.GetVersionInfo()+": "+err.Error(), "a resource of the wrapped cache cannot be decoded; left out",
				"type", typeURL, "error", err)
			continue
		}
		answered = append(answered, it)
	}
	return resp, answered, nil
}

// logBad logs an error about what the wrapped cache serves, once for each key (a bad resource
// at a version): every stream that reads the same answer meets the same bad resources. It
// remembers maxBadLogged keys, then starts afresh.
func (g *Guard) logBad(key, msg string, args ...any) {
	g.badMu.Lock()
	_, again := g.badLogged[key]
	if !again {
		if len(g.badLogged) >= maxBadLogged {
			clear(g.badLogged)
		}
		g.badLogged[key] = struct{}{}
	}
	g.badMu.Unlock()
	if !again {
		g.log.Error(msg, args...)
	}
}

// maxBadLogged bounds the bad resources logBad remembers.
const maxBadLogged = 256

// encodeEach encodes the resources of a RawResponse that go-control-plane could not encode as a
// whole (whole: why), one by one, and leaves out, logged, those that cannot be: one resource
// with a bad field (a string that is not UTF-8) must not stop every other resource of its type
// from reaching the clients. It returns the encoded response and the resources it carries, in
// its order; another response, or one with TTLs (their wrappers are the cache's to make), fails
// with whole.
func (g *Guard) encodeEach(r cache.Response, whole error) (*discovery.DiscoveryResponse, []types.ResourceWithTTL, error) {
	rr, ok := r.(*cache.RawResponse)
	if !ok || rr.Heartbeat {
		return nil, nil, whole
	}
	typeURL := r.GetRequest().GetTypeUrl()
	resp := &discovery.DiscoveryResponse{VersionInfo: rr.Version, TypeUrl: typeURL}
	var kept []types.ResourceWithTTL
	for _, x := range rr.GetRawResources() {
		if x.TTL != nil || x.Resource == nil {
			return nil, nil, whole
		}
		b, err := cache.MarshalResource(x.Resource)
		if err != nil {
			name := cache.GetResourceName(x.Resource)
			g.logBad(typeURL+"/"+name+"@"+rr.Version, "a resource of the wrapped cache cannot be encoded; left out until it changes",
				"type", typeURL, "name", name, "error", err)
			continue
		}
		resp.Resources = append(resp.Resources, &anypb.Any{TypeUrl: typeURL, Value: b})
		kept = append(kept, x)
	}
	return resp, kept, nil
}

// feed is the guard's one watch of the wrapped cache for a type, shared by every stream that asks
// for the type, when the cache answers every node alike (Options.NodeIndependent): the cache
// works for one watch, and the guard reads each answer once, whatever the streams. It watches
// until its last stream leaves, or the guard closes.
type feed struct {
	g       *Guard
	typeURL string
	node    *core.Node // the first stream's: the node the watches are made for
	out     chan cache.Response
	stop    chan struct{} // closed when the last stream leaves, or by Close

	cur  atomic.Pointer[served] // nil until the first answer
	mu   sync.Mutex             // guards subs
	subs map[*session]struct{}
}

// subscribe adds s to the feed of typeURL, started for it if there is none. Call with s.mu
// (the lock order is s.mu, g.feedsMu, feed.mu).
func (g *Guard) subscribe(s *session, typeURL string, node *core.Node) *feed {
	g.feedsMu.Lock()
	defer g.feedsMu.Unlock()
	f := g.feeds[typeURL]
	if f == nil {
		f = &feed{g: g, typeURL: typeURL, node: node, out: make(chan cache.Response, 1), stop: make(chan struct{}),
			subs: map[*session]struct{}{}}
		if g.feedsStopped {
			return f // the guard is closing: a stream that opens now is never answered
		}
		g.feeds[typeURL] = f
		g.feedsRun.Go(f.run)
	}
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.mu.Unlock()
	return f
}

// unsubscribe takes s off f, and stops f if it was its last stream.
func (g *Guard) unsubscribe(s *session, f *feed) {
	g.feedsMu.Lock()
	defer g.feedsMu.Unlock()
	f.mu.Lock()
	delete(f.subs, s)
	last := len(f.subs) == 0
	f.mu.Unlock()
	if last && g.feeds[f.typeURL] == f {
		delete(g.feeds, f.typeURL)
		close(f.stop)
	}
}

// stopFeeds stops every feed and waits for them (Close).
func (g *Guard) stopFeeds() {
	g.feedsMu.Lock()
	g.feedsStopped = true
	for t, f := range g.feeds {
		delete(g.feeds, t)
		close(f.stop)
	}
	g.feedsMu.Unlock()
	g.feedsRun.Wait()
}

// run watches the wrapped cache for every resource of the type, one version after another, and
// tells each stream of each new one, until stop.
func (f *feed) run() {
	defer func() { f.g.share(f.cur.Load(), nil) }() // the codec forgets what the feed served
	like := &discovery.DiscoveryRequest{Node: f.node, TypeUrl: f.typeURL}
	version, returned := "", map[string]string(nil)
	for {
		req, sub := wildcard(like, version, returned)
		cancel, err := f.g.inner.CreateWatch(req, sub, f.out)
		if err != nil {
			f.g.log.Error("the wrapped cache refused a watch", "type", f.typeURL, "error", err)
			<-f.stop
			return
		}
		var r cache.Response
		select {
		case <-f.stop:
			if cancel != nil {
				cancel()
			}
			return
		case r = <-f.out:
		}
		if cancel != nil {
			cancel()
		}
		resp, answered, err := f.g.answer(r)
		if err != nil {
			f.g.log.Error("the wrapped cache's response cannot be encoded", "error", err)
			<-f.stop
			return
		}
		version, returned = resp.GetVersionInfo(), r.GetReturnedResources()
		was := f.cur.Load()
		next := was.fold(f.typeURL, answered, version, returned, false)
		f.g.share(was, next)
		f.cur.Store(next)
		f.mu.Lock()
		for s := range f.subs {
			s.poke() // its goroutine takes the new served (fromFeeds)
		}
		f.mu.Unlock()
	}
}
