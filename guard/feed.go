package guard

// The guard's watches of the wrapped cache: for each node (or once, when shared), one wildcard
// watch a type its clients ask for, whose answers make the engine's snapshot of the node.

import (
	"errors"
	"maps"
	"slices"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"

	"github.com/kds-host/kds-host/engine"
)

// feed is what the wrapped cache serves one node (every node, when shared): the node's
// snapshot, published to the engine for each of its streams, or as the engine's global snapshot
// when shared. It watches until its node's last stream closes (stop), or the guard closes.
type feed struct {
	g       *Guard
	id      string     // the node id ("" when shared)
	node    *core.Node // the first stream's: the node the watches are made for
	streams int        // open streams of the node (under g.mu)

	mu      sync.Mutex // guards the fields below; SetNodeSnapshot is called with it, so calls for a node are in order
	snap    *engine.Snapshot
	pooled  *pooled                      // snap, in the guard's pool (per-node caches; nil until the first answer)
	keys    map[string]bool              // the engine's nodes of the node's streams
	types   map[string]map[string]string // the types watched: what each watch's last answer says it returned
	done    chan struct{}                // closed by stop
	stopped bool
}

// join publishes the node's snapshot to a new stream's engine node, before the engine admits it.
func (f *feed) join(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys[key] = true
	if !f.g.shared && f.snap != nil {
		f.g.s.SetNodeSnapshot(key, f.snap)
	}
}

// leave forgets a closed stream's engine node.
func (f *feed) leave(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.keys, key)
	if !f.g.shared {
		f.g.s.Cache.SetNodeSnapshot(key, nil)
	}
}

// watch starts the type's watch of the wrapped cache, unless it runs already.
func (f *feed) watch(typeURL string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.types[typeURL]; f.stopped || ok {
		return
	}
	f.types[typeURL] = nil
	g := f.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.stopped {
		g.running.Go(func() { f.run(typeURL) })
	}
}

// stop stops the feed's watches.
func (f *feed) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.stopped {
		f.stopped = true
		close(f.done)
		f.g.pool.release(f.pooled)
		f.pooled = nil
	}
}

// stopFeeds stops every feed and waits for their watches (Close).
func (g *Guard) stopFeeds() {
	g.mu.Lock()
	g.stopped = true
	feeds := slices.Collect(maps.Values(g.feeds))
	g.mu.Unlock()
	for _, f := range feeds {
		f.stop()
	}
	g.running.Wait()
}

// run watches the wrapped cache for every resource of the type, one version after another, and
// applies each answer, until stop. Each watch passes what the last answer returned: a cache that
// compares it with what it serves (SnapshotCache) would otherwise answer again at once, forever.
func (f *feed) run(typeURL string) {
	g := f.g
	out := make(chan cache.Response, 1)
	version, returned := "", map[string]string(nil)
	for {
		sub := stream.NewSotwSubscription(nil, true)
		if returned != nil {
			sub.SetReturnedResources(returned)
		}
		cancel, err := g.inner.CreateWatch(&discovery.DiscoveryRequest{Node: f.node, TypeUrl: typeURL, VersionInfo: version}, &sub, out)
		if err != nil {
			g.opts.Logger.Error("the wrapped cache refused a watch", "type", typeURL, "error", err)
			<-f.done
			return
		}
		if cancel == nil {
			cancel = func() {}
		}
		var r cache.Response
		select {
		case <-f.done:
			cancel()
			return
		case r = <-out:
		}
		// The answer goes out before the watch is let go of: a SnapshotCache takes, to let go of
		// it, the lock it holds while it answers every other node's watches.
		v, entries, err := g.answer(r)
		if err == nil {
			version, returned = v, r.GetReturnedResources()
			f.apply(typeURL, entries, returned)
		}
		cancel()
		if err != nil {
			g.opts.Logger.Error("the wrapped cache's response cannot be encoded", "error", err)
			<-f.done
			return
		}
	}
}

// apply makes the node's snapshot hold what the wrapped cache answered of typeURL (entries, and
// the names it says it returned), and publishes it. A SotW answer of a type other than Listeners
// and Clusters may be what changed only: what was, changed by it, less what is no longer returned.
func (f *feed) apply(typeURL string, entries []*engine.Entry, returned map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	cur := f.snap.Type(typeURL)
	next := make(map[string]*engine.Entry, len(entries))
	if last := f.types[typeURL]; typeURL != resource.ListenerType && typeURL != resource.ClusterType && last != nil && returned != nil {
		maps.Copy(next, cur)
		for n := range last {
			if _, ok := returned[n]; !ok {
				delete(next, n)
			}
		}
	}
	f.types[typeURL] = returned
	for _, e := range entries {
		next[e.Name] = e
	}
	var put []*engine.Entry
	var removed []string
	for n, e := range next {
		if cur[n] != e {
			put = append(put, e)
		}
	}
	for n := range cur {
		if next[n] == nil {
			removed = append(removed, n)
		}
	}
	if len(put)+len(removed) == 0 && f.snap.Has(typeURL) {
		return
	}
	snap := f.snap.Update(put, map[string][]string{typeURL: removed})
	if !snap.Has(typeURL) {
		snap = snap.Declare(typeURL)
	}
	if f.g.shared {
		f.snap = snap
		f.g.s.SetSnapshot(snap)
		return
	}
	f.pooled = f.g.pool.share(snap, f.pooled) // another node's, when it is the same
	snap = f.pooled.snap
	f.snap = snap
	for key := range f.keys {
		f.g.s.SetNodeSnapshot(key, snap)
	}
}

// answer reads an answer of the wrapped cache: its version, and its resources as the engine's
// entries, each made once whatever the nodes that get it. A resource that cannot be encoded or
// read is logged and left out, so that it does not stop the others of its type.
func (g *Guard) answer(r cache.Response) (string, []*engine.Entry, error) {
	typeURL := r.GetRequest().GetTypeUrl()
	rr, ok := r.(*cache.RawResponse)
	var raw []types.ResourceWithTTL
	if ok && !rr.Heartbeat {
		raw = rr.GetRawResources()
	}
	if raw != nil && !slices.ContainsFunc(raw, func(x types.ResourceWithTTL) bool { return x.TTL != nil || x.Resource == nil }) {
		entries, errs := g.items.ofRaws(typeURL, rr.Version, raw, g.opts.Owners)
		answered := make([]*engine.Entry, 0, len(entries))
		for i, e := range entries {
			var err error
			if errs != nil {
				err = errs[i]
			}
			var notEncoded errNotEncoded
			switch {
			case errors.As(err, &notEncoded):
				name := cache.GetResourceName(raw[i].Resource)
				g.logBad(typeURL+"/"+name+"@"+rr.Version, "a resource of the wrapped cache cannot be encoded; left out until it changes",
					"type", typeURL, "name", name, "error", notEncoded.error)
			case err != nil:
				g.logBad(typeURL+"@"+rr.Version+": "+err.Error(), "a resource of the wrapped cache cannot be decoded; left out", "type", typeURL, "error", err)
			default:
				answered = append(answered, e)
			}
		}
		return rr.Version, answered, nil
	}
	resp, err := r.GetDiscoveryResponse()
	if err != nil {
		return "", nil, err
	}
	answered := make([]*engine.Entry, 0, len(resp.GetResources()))
	for _, a := range resp.GetResources() {
		e, err := g.items.of(typeURL, a, nil, g.opts.Owners)
		if err != nil {
			g.logBad(typeURL+"@"+resp.GetVersionInfo()+": "+err.Error(), "a resource of the wrapped cache cannot be decoded; left out",
				"type", typeURL, "error", err)
			continue
		}
		answered = append(answered, e)
	}
	return resp.GetVersionInfo(), answered, nil
}

// logBad logs an error about what the wrapped cache serves once for each key (a bad resource at
// a version), whatever the nodes that read it; it remembers maxBadLogged keys, then starts afresh.
func (g *Guard) logBad(key, msg string, args ...any) {
	g.items.mu.Lock()
	_, again := g.items.bad[key]
	if !again {
		if len(g.items.bad) >= maxBadLogged {
			clear(g.items.bad)
		}
		g.items.bad[key] = struct{}{}
	}
	g.items.mu.Unlock()
	if !again {
		g.opts.Logger.Error(msg, args...)
	}
}

// maxBadLogged bounds the bad resources logBad remembers.
const maxBadLogged = 256
