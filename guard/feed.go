package guard

// The guard's watches of the wrapped cache: for each node (or once, when shared), one wildcard
// watch a type its clients ask for, whose answers make the engine's snapshot of the node.

import (
	"errors"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"

	"github.com/kds-host/kds-host/engine"
)

// feed is what the wrapped cache serves one node (one NodeHash ID's nodes; every node when
// shared): its snapshot, published for each of its streams (as the global one when shared). It
// watches until the node's last stream closes (stop) or the guard closes.
type feed struct {
	g       *Guard
	id      string     // the node id (Options.NodeHash's ID; "" when shared)
	node    *core.Node // the first stream's: the node the watches are made for
	streams int        // open streams of the node (under g.mu)

	mu      sync.Mutex // guards the fields below; SetNodeSnapshot is called with it, so calls for a node are in order
	snap    *engine.Snapshot
	pooled  *pooled                      // snap, in the guard's pool (per-node caches; nil until the first answer)
	keys    map[string]bool              // the engine's nodes of the node's streams
	types   map[string]map[string]string // the types answered: what each watch's last answer says it returned
	watches map[string]*feedWatch        // by type URL
	stopped bool
}

// feedWatch is a feed's watch of one type: one watch of the wrapped cache after another, each
// made when the last is answered.
type feedWatch struct {
	f       *feed
	typeURL string
	// What the last answer said (set before the watch is queued again), and the open watch
	// (the watcher's goroutine only).
	version  string
	returned map[string]string
	req      *discovery.DiscoveryRequest
	cancel   func()
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

// watch has the watcher watch the wrapped cache for the type, unless it does already.
func (f *feed) watch(typeURL string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.watches[typeURL]; f.stopped || ok {
		return
	}
	fw := &feedWatch{f: f, typeURL: typeURL}
	f.watches[typeURL] = fw
	if w := f.g.watcher(); w != nil {
		w.again(fw, "", nil)
	}
}

// stop stops the feed's watches.
func (f *feed) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	f.g.pool.release(f.pooled)
	f.pooled = nil
	f.g.mu.Lock()
	w := f.g.watches
	f.g.mu.Unlock()
	for _, fw := range f.watches {
		w.letGo(fw)
	}
}

// watcher is the guard's, started with the first watch (nil if Close came first).
func (g *Guard) watcher() *watcher {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.watches == nil && !g.stopped {
		g.watches = newWatcher(g)
	}
	return g.watches
}

// stopFeeds stops every feed, lets go of their watches and waits for the watcher (Close).
func (g *Guard) stopFeeds() {
	g.mu.Lock()
	g.stopped = true
	feeds := slices.Collect(maps.Values(g.feeds))
	w := g.watches
	g.mu.Unlock()
	for _, f := range feeds {
		f.stop()
	}
	if w != nil {
		w.close()
	}
}

// watcher makes and lets go of every feed's watches of the wrapped cache on one goroutine; a
// few workers apply the answers. No worker waits for the wrapped cache: a SnapshotCache answers
// a node's watches under its lock, so a worker making watches could block the answers it awaits.
type watcher struct {
	g       *Guard
	answers chan cache.Response // every watch's

	mu      sync.Mutex                                 // guards the fields below
	open    map[*discovery.DiscoveryRequest]*feedWatch // the watches made and not answered
	pending []*feedWatch                               // to watch again, or let go of once their feed stopped
	closing bool

	wake    chan struct{} // capacity 1: pending grew
	drained chan struct{} // closed when the watcher has let go of every watch (close)
	done    chan struct{} // closed by close: the workers return
	running sync.WaitGroup
}

func newWatcher(g *Guard) *watcher {
	w := &watcher{g: g, answers: make(chan cache.Response, 1024), open: map[*discovery.DiscoveryRequest]*feedWatch{},
		wake: make(chan struct{}, 1), drained: make(chan struct{}), done: make(chan struct{})}
	w.running.Go(w.watch)
	for range runtime.GOMAXPROCS(0) {
		w.running.Go(w.work)
	}
	return w
}

// again has fw watched again from version, and what its last answer returned.
func (w *watcher) again(fw *feedWatch, version string, returned map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fw.version, fw.returned = version, returned
	w.queueLocked(fw)
}

// letGo has fw's watch let go of (its feed stopped).
func (w *watcher) letGo(fw *feedWatch) {
	if w == nil {
		return // no watch was made
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.queueLocked(fw)
}

func (w *watcher) queueLocked(fw *feedWatch) {
	if w.closing {
		return
	}
	w.pending = append(w.pending, fw)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// close lets go of every watch, then stops the workers.
func (w *watcher) close() {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	<-w.drained // the workers drain answers meanwhile: a cache may be answering
	close(w.done)
	w.running.Wait()
}

// watch is the watcher's goroutine: it lets go of each queued watch, and watches again each whose
// feed runs, from what its last answer returned: a cache that compares it with what it serves
// (SnapshotCache) would otherwise answer again at once, forever.
func (w *watcher) watch() {
	for {
		<-w.wake
		w.mu.Lock()
		todo, closing := w.pending, w.closing
		w.pending = nil
		w.mu.Unlock()
		for _, fw := range todo {
			w.rewatch(fw, closing)
		}
		if closing {
			w.mu.Lock()
			left := slices.Collect(maps.Values(w.open))
			w.mu.Unlock()
			for _, fw := range left {
				w.rewatch(fw, true)
			}
			close(w.drained)
			return
		}
	}
}

// rewatch lets go of fw's watch, and makes the next unless its feed stopped or closing.
func (w *watcher) rewatch(fw *feedWatch, closing bool) {
	if fw.cancel != nil {
		fw.cancel()
		fw.cancel = nil
	}
	w.mu.Lock()
	delete(w.open, fw.req)
	w.mu.Unlock()
	fw.f.mu.Lock()
	stopped := fw.f.stopped
	fw.f.mu.Unlock()
	if stopped || closing {
		return
	}
	sub := stream.NewSotwSubscription(nil, true)
	if fw.returned != nil {
		sub.SetReturnedResources(fw.returned)
	}
	fw.req = &discovery.DiscoveryRequest{Node: fw.f.node, TypeUrl: fw.typeURL, VersionInfo: fw.version}
	w.mu.Lock()
	w.open[fw.req] = fw // before the cache may answer it
	w.mu.Unlock()
	cancel, err := w.g.inner.CreateWatch(fw.req, &sub, w.answers)
	if err != nil {
		w.g.opts.Logger.Error("the wrapped cache refused a watch", "type", fw.typeURL, "error", err)
		w.mu.Lock()
		delete(w.open, fw.req)
		w.mu.Unlock()
		return // the feed waits for its stop
	}
	fw.cancel = cancel
}

// work is a worker: it applies the answers, each to its feed, and has the watch made again.
func (w *watcher) work() {
	for {
		select {
		case <-w.done:
			return
		case r := <-w.answers:
			w.mu.Lock()
			fw := w.open[r.GetRequest()]
			delete(w.open, r.GetRequest())
			w.mu.Unlock()
			if fw == nil {
				continue // let go of meanwhile
			}
			// The answer goes out before the watch is let go of: a SnapshotCache takes, to let go
			// of it, the lock it holds while it answers every other node's watches.
			v, entries, err := w.g.answer(r)
			if err != nil {
				w.g.opts.Logger.Error("the wrapped cache's response cannot be encoded", "error", err)
				continue // the feed waits for its stop
			}
			fw.f.apply(fw.typeURL, entries, r.GetReturnedResources())
			w.again(fw, v, r.GetReturnedResources())
		}
	}
}

// apply makes the node's snapshot hold what the wrapped cache answered of typeURL (entries, and
// the names it says it returned), and publishes it. A SotW answer of a type but Listeners and
// Clusters may be only what changed. Nodes of a per-node cache stepping from one pooled snapshot
// with the same answer take the first one's step (snapPool.stepped).
func (f *feed) apply(typeURL string, entries []*engine.Entry, returned map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	last := f.types[typeURL]
	f.types[typeURL] = returned
	whole := typeURL == resource.ListenerType || typeURL == resource.ClusterType || last == nil || returned == nil
	from := f.pooled
	if whole && from != nil {
		slices.SortFunc(entries, func(a, b *engine.Entry) int { return strings.Compare(a.Name, b.Name) })
		if to := f.g.pool.stepped(from, typeURL, entries); to != nil {
			f.publish(to)
			return
		}
	}
	cur := f.snap.Type(typeURL)
	next := make(map[string]*engine.Entry, len(entries))
	if !whole {
		maps.Copy(next, cur)
		for n := range last {
			if _, ok := returned[n]; !ok {
				delete(next, n)
			}
		}
	}
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
	to := f.g.pool.share(snap, from) // another node's, when it is the same
	if whole && from != nil {
		f.g.pool.took(from, typeURL, entries, to)
	}
	f.publish(to)
}

// publish makes to the node's snapshot, and publishes it to the node's streams unless it was
// already: those of many nodes (a NodeHash ID's) as the engine fans a write out.
func (f *feed) publish(to *pooled) {
	f.pooled = to
	if to.snap == f.snap {
		return
	}
	f.snap = to.snap
	if len(f.keys) > 1 {
		f.g.s.SetNodesSnapshot(slices.Collect(maps.Keys(f.keys)), to.snap)
		return
	}
	for key := range f.keys {
		f.g.s.SetNodeSnapshot(key, to.snap)
	}
}

// answer reads an answer of the wrapped cache: its version, and its resources as the engine's
// entries (each made once for all nodes); one that cannot be encoded or read is logged, left out.
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
// a version), whatever the nodes that read it; it remembers 256 keys, then starts afresh.
func (g *Guard) logBad(key, msg string, args ...any) {
	g.items.mu.Lock()
	_, again := g.items.bad[key]
	if !again {
		if len(g.items.bad) >= 256 {
			clear(g.items.bad)
		}
		g.items.bad[key] = struct{}{}
	}
	g.items.mu.Unlock()
	if !again {
		g.opts.Logger.Error(msg, args...)
	}
}
