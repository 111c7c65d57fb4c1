package kds

import (
	"context"
	"errors"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/kds-host/kds-host/host/shrink"
)

// Filter decides, per zone, which entries of a snapshot enter that zone's view (owner holds). An
// entry it hides is not sent; a zone that already has an older version of it keeps that one. It
// is called with a stream's lock held and must not block.
type Filter interface {
	Visible(zone string, e *Entry) bool
}

// ZoneFilter is a Filter that can answer a whole walk of a zone's entries at once: View returns
// Visible for one zone, whether the zone may see nothing at all yet (none), and a release to call
// when the walk is done (a filter takes its lock once per walk, not once per entry).
type ZoneFilter interface {
	Filter
	View(zone string) (visible func(*Entry) bool, none bool, release func())
}

// Cache is the ConfigWatcher behind the delta server: it answers each stream's watches from the
// current Snapshot, as seen through the zone's Filter, and lets the retry scheduler force names
// to be sent again.
//
// It avoids the flaws of go-control-plane's stock caches. It never sends on a stream's response
// channel while holding a lock, or from the stream's own goroutine: each stream has one sender
// goroutine that feeds the channel in order (so with 32 kinds or more nothing deadlocks on the
// channel's 20 slots, go-control-plane issue 875). Each stream has its own lock, so a thousand
// streams are answered in parallel, and a snapshot update looks at the changed names of each
// stream only: nothing copies a kind's map per stream per write.
//
// Per stream and kind, the cache keeps what the zone holds (known: the versions of the responses
// it delivered, not what the delta server thinks it sent) and the names that may differ from the
// snapshot (dirty). Since the delta server marks a resource as known when it is sent and never
// resends after a NACK, the names the retry scheduler forces are dirty until sent again.
type Cache struct {
	kinds []string // kind order: owners first; responses that are ready together go in this order

	snap    atomic.Pointer[Snapshot]
	version atomic.Int64
	filter  atomic.Pointer[filterBox]

	mu       sync.Mutex // guards the maps below; never held while a stream's lock is
	streams  map[int64]*streamState
	byZone   map[string]map[int64]*streamState
	requests map[*discovery.DeltaDiscoveryRequest]int64 // request -> stream, set by the callbacks
	peak     shrink.Peak                                // of streams
	zonePeak shrink.Peak
}

// filterBox holds a Filter for an atomic pointer.
type filterBox struct{ Filter }

// NewCache returns a cache for the given kinds, in owner-first order.
func NewCache(kinds []string) *Cache {
	c := &Cache{kinds: kinds, streams: map[int64]*streamState{}, byZone: map[string]map[int64]*streamState{},
		requests: map[*discovery.DeltaDiscoveryRequest]int64{}}
	c.snap.Store(&Snapshot{})
	c.filter.Store(&filterBox{})
	return c
}

// streamState is one zone stream's kinds and the goroutine that sends its responses.
type streamState struct {
	cache *Cache
	id    int64
	zone  string

	mu    sync.Mutex
	kinds map[string]*kindState
	queue []*watch // answered watches waiting for the sender, in order

	wake chan struct{} // capacity 1: the queue grew
	stop chan struct{} // closed when the stream closes
	done chan struct{} // closed when the sender has returned
}

// kindState is what a stream knows of one kind.
type kindState struct {
	watch   *watch            // the open watch, if any
	started bool              // known was seeded from the zone's initial versions
	known   map[string]string // name -> version the zone holds, from delivered responses
	dirty   map[string]bool   // names that may differ from the snapshot
	full    bool              // every name may differ: look at them all
	forced  map[string]bool   // names to send although the zone knows their version
	served  map[string]string // handed to the delta server as the next version map; never read
}

func (st *streamState) kind(k string) *kindState {
	ks := st.kinds[k]
	if ks == nil {
		ks = &kindState{known: map[string]string{}, dirty: map[string]bool{}, forced: map[string]bool{}, served: map[string]string{}}
		st.kinds[k] = ks
	}
	return ks
}

// watch is one open delta watch: the server's request for a kind, answered at most once.
type watch struct {
	kind string
	req  *discovery.DeltaDiscoveryRequest
	sub  cache.Subscription
	out  chan cache.DeltaResponse

	answered bool                            // at most once
	resp     *cache.DeltaPassthroughResponse // the answer, until it is delivered
	undo     []prior                         // what known had before the response, of the names it had
	forced   []string                        // forced names the response carries
	canceled chan struct{}                   // closed by cancel
	finished chan struct{}                   // closed by the sender when it is done with this watch
	sending  bool                            // the sender has taken it off the queue
}

// SetSnapshot replaces what is served and answers every open watch that now has something new.
// When s was derived from the snapshot served (SnapshotBuilder.Update), each stream looks at the
// changed names of the changed kinds only; otherwise at every name. Streams are answered in
// parallel, one worker a core.
func (c *Cache) SetSnapshot(s *Snapshot) {
	changed, delta := s.ChangesFrom(c.snap.Load())
	c.snap.Store(s)
	c.version.Add(1)
	c.mu.Lock()
	streams := make([]*streamState, 0, len(c.streams))
	for _, st := range c.streams {
		streams = append(streams, st)
	}
	c.mu.Unlock()
	c.each(streams, func(st *streamState) {
		st.mu.Lock()
		defer st.mu.Unlock()
		for _, kind := range c.kinds {
			ks := st.kinds[kind]
			if ks == nil {
				continue // not subscribed
			}
			names := changed[kind]
			switch {
			case !delta:
				ks.full = true
			case len(names) == 0:
				continue
			default:
				for _, n := range names {
					ks.dirty[n] = true
				}
			}
			c.evaluateLocked(st, ks)
		}
	})
}

// each runs f on every stream, on as many goroutines as there are cores, and returns when all
// are done.
func (c *Cache) each(streams []*streamState, f func(*streamState)) {
	workers := min(runtime.GOMAXPROCS(0), len(streams))
	if workers <= 1 {
		for _, st := range streams {
			f(st)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(streams)); i = next.Add(1) - 1 {
				f(streams[i])
			}
		})
	}
	wg.Wait()
}

// SetFilter installs the per-zone filter (nil: every zone sees everything).
func (c *Cache) SetFilter(f Filter) { c.filter.Store(&filterBox{f}) }

// Refresh re-evaluates the named entries (kind -> xDS names) of a zone's streams, after the
// filter's answer changed for them (and for no other entry).
func (c *Cache) Refresh(zone string, names map[string][]string) {
	c.mu.Lock()
	streams := slices.Collect(maps.Values(c.byZone[zone]))
	c.mu.Unlock()
	for _, st := range streams {
		st.mark(names, false)
	}
}

// Snapshot returns what is served now.
func (c *Cache) Snapshot() *Snapshot { return c.snap.Load() }

// Resend makes the stream send the named resources of each kind again, although the zone was
// already sent their current version (it rejected them). Names no longer served are ignored.
// Only the named names of the named kinds are looked at.
func (c *Cache) Resend(streamID int64, names map[string][]string) {
	c.mu.Lock()
	st := c.streams[streamID]
	c.mu.Unlock()
	if st != nil {
		st.mark(names, true)
	}
}

// mark makes names (kind -> names) dirty, forced too when force, and answers the open watches
// that now have something to send.
func (st *streamState) mark(names map[string][]string, force bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, kind := range st.cache.kinds {
		ns := names[kind]
		if len(ns) == 0 {
			continue
		}
		ks := st.kind(kind)
		if !force && 2*len(ns) >= len(st.cache.snap.Load().Kind(kind)) {
			ks.full = true // most of the kind (owner holds releasing what waited): one walk
		} else {
			for _, n := range ns {
				ks.dirty[n] = true
				if force {
					ks.forced[n] = true
				}
			}
		}
		st.cache.evaluateLocked(st, ks)
	}
}

// bindRequest tells the cache which stream a request belongs to, and which names of its kind
// to send again although the zone knows them (a re-request); the delta server calls the request
// callback and then CreateDeltaWatch with the same request, on the stream's goroutine.
func (c *Cache) bindRequest(streamID int64, zone string, req *discovery.DeltaDiscoveryRequest, again []string) {
	c.mu.Lock()
	c.requests[req] = streamID
	st := c.streams[streamID]
	if st == nil {
		st = c.openStreamLocked(streamID, zone)
	}
	c.mu.Unlock()
	if len(again) > 0 {
		st.mu.Lock()
		ks := st.kind(req.GetTypeUrl())
		for _, n := range again {
			ks.dirty[n], ks.forced[n] = true, true
		}
		st.mu.Unlock()
	}
}

func (c *Cache) openStreamLocked(id int64, zone string) *streamState {
	st := &streamState{
		cache: c, id: id, zone: zone, kinds: map[string]*kindState{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	c.streams[id] = st
	if c.byZone[zone] == nil {
		c.byZone[zone] = map[int64]*streamState{}
	}
	c.byZone[zone][id] = st
	go st.send()
	return st
}

// closeStream frees a stream's state and stops its sender. The delta server cancels every watch
// of a stream before it calls the close callback, so nothing is left to send.
func (c *Cache) closeStream(id int64) {
	c.mu.Lock()
	st := c.streams[id]
	delete(c.streams, id)
	c.streams = shrink.Map(c.streams, &c.peak)
	if st != nil {
		delete(c.byZone[st.zone], id)
		if len(c.byZone[st.zone]) == 0 {
			delete(c.byZone, st.zone)
			c.byZone = shrink.Map(c.byZone, &c.zonePeak)
		}
	}
	for req, sid := range c.requests {
		if sid == id {
			delete(c.requests, req) // bound, but its watch was never created
		}
	}
	if len(c.requests) == 0 {
		c.requests = map[*discovery.DeltaDiscoveryRequest]int64{} // it is empty between requests
	}
	c.mu.Unlock()
	if st != nil {
		close(st.stop)
		<-st.done
	}
}

// Close stops every stream's sender.
func (c *Cache) Close() {
	c.mu.Lock()
	ids := make([]int64, 0, len(c.streams))
	for id := range c.streams {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		c.closeStream(id)
	}
}

// CreateDeltaWatch implements cache.ConfigWatcher. It never blocks: a response that is ready is
// queued for the stream's sender.
func (c *Cache) CreateDeltaWatch(req *discovery.DeltaDiscoveryRequest, sub cache.Subscription, out chan cache.DeltaResponse) (func(), error) {
	c.mu.Lock()
	id, ok := c.requests[req]
	delete(c.requests, req)
	st := c.streams[id]
	c.mu.Unlock()
	if !ok {
		return nil, errors.New("kds: request was not seen by the stream callbacks")
	}
	if st == nil {
		return nil, errors.New("kds: the request's stream is closed")
	}
	w := &watch{kind: req.GetTypeUrl(), req: req, sub: sub, out: out, canceled: make(chan struct{}), finished: make(chan struct{})}
	st.mu.Lock()
	defer st.mu.Unlock()
	ks := st.kind(w.kind)
	if !ks.started {
		// What the zone said it holds when it subscribed (initial_resource_versions).
		ks.started, ks.full = true, true
		for n, v := range sub.ReturnedResources() {
			ks.known[n] = v
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		// As the delta server does: a wildcard watch tells the zone whether the name is still
		// there; another forgets it.
		if sub.IsWildcard() {
			ks.known[n], ks.dirty[n] = "", true
		} else {
			delete(ks.known, n)
		}
	}
	for _, n := range req.GetResourceNamesSubscribe() {
		if n == "*" {
			ks.full = true
		}
		ks.dirty[n] = true // a re-request, or a new name of a named subscription
	}
	ks.watch = w
	c.evaluateLocked(st, ks)
	return func() { c.cancel(st, w) }, nil
}

// CreateWatch implements cache.ConfigWatcher; KDS is delta only.
func (c *Cache) CreateWatch(*cache.Request, cache.Subscription, chan cache.Response) (func(), error) {
	return nil, errors.New("kds serves delta xDS only")
}

// Fetch implements cache.ConfigFetcher; KDS is delta only.
func (c *Cache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errors.New("kds serves delta xDS only")
}

func (c *Cache) cancel(st *streamState, w *watch) {
	st.mu.Lock()
	if ks := st.kinds[w.kind]; ks != nil && ks.watch == w {
		ks.watch = nil
	}
	select {
	case <-w.canceled:
		st.mu.Unlock()
		return
	default:
	}
	close(w.canceled)
	wait := w.sending
	if i := slices.Index(st.queue, w); i >= 0 {
		st.queue = slices.Delete(st.queue, i, i+1)
		st.requeue(w) // never delivered: its names are dirty again
	}
	st.mu.Unlock()
	if wait {
		<-w.finished // the sender takes it back if it was not delivered
	}
}

// evaluateLocked answers the kind's open, unanswered watch when the zone's view of the snapshot
// differs from what the zone holds in a dirty name (or in any name, when full). Call with the
// stream's lock.
func (c *Cache) evaluateLocked(st *streamState, ks *kindState) {
	w := ks.watch
	if w == nil || w.answered || (!ks.full && len(ks.dirty) == 0) {
		return
	}
	snap := c.snap.Load()
	entries := snap.Kind(w.kind)
	var visible func(*Entry) bool // nil: everything
	switch f := c.filter.Load().Filter.(type) {
	case nil:
	case ZoneFilter:
		v, none, release := f.View(st.zone)
		defer release()
		if none && len(ks.known) == 0 {
			// Nothing to send or remove (a zone whose first owner check has not answered): the
			// walk waits for the Refresh that the check makes, its dirty names kept.
			return
		}
		visible = v
	default:
		visible = func(e *Entry) bool { return f.Visible(st.zone, e) }
	}
	resp := &discovery.DeltaDiscoveryResponse{TypeUrl: w.kind, SystemVersionInfo: strconv.FormatInt(c.version.Load(), 10)}
	var sentForced []string
	look := func(name string) {
		v, isKnown := ks.known[name]
		e, served := entries[name]
		served = served && w.subscribes(name)
		switch {
		case served && isKnown && v == e.Version && !ks.forced[name]:
			// The zone has it: whether it may see it or not, nothing to send.
		case served && visible != nil && !visible(e):
			// Held back: the zone keeps what it has (no update, and no removal either).
			if !isKnown {
				delete(ks.forced, name) // not served to this zone: nothing to resend
			}
		case served:
			resp.Resources = append(resp.Resources, e.Wire)
			if ks.forced[name] {
				sentForced = append(sentForced, name)
			}
		default:
			delete(ks.forced, name) // no longer served: nothing to resend
			if isKnown {
				resp.RemovedResources = append(resp.RemovedResources, name)
			}
		}
	}
	if ks.full {
		for _, n := range snap.Names(w.kind) { // sorted: so is the response
			look(n)
		}
		for n := range ks.known {
			if _, ok := entries[n]; !ok {
				look(n)
			}
		}
	} else {
		for n := range ks.dirty {
			look(n)
		}
		slices.SortFunc(resp.Resources, func(a, b *discovery.Resource) int { return strings.Compare(a.Name, b.Name) })
	}
	ks.full = false
	clear(ks.dirty)
	if len(resp.Resources)+len(resp.RemovedResources) == 0 {
		return
	}
	slices.Sort(resp.RemovedResources)
	// The delta server keeps the next version map as the subscription's returned resources;
	// the cache reads its own known map instead, so the server gets one that nobody reads.
	w.answered = true
	w.resp = &cache.DeltaPassthroughResponse{DeltaRequest: w.req, NextVersionMap: ks.served, DeltaDiscoveryResponse: resp}
	w.forced = sentForced
	st.queue = append(st.queue, w)
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// prior is what known had for a name.
type prior struct{ name, version string }

// subscribes reports whether the watch's subscription covers name.
func (w *watch) subscribes(name string) bool {
	if w.sub.IsWildcard() {
		return true
	}
	_, ok := w.sub.SubscribedResources()[name]
	return ok
}

// send is the stream's sender: it feeds queued responses into the server's channel in order.
// A response counts in what the zone holds from the moment it is handed over; one that is not
// (its watch canceled meanwhile) is taken back. cancel waits for a send in progress.
func (st *streamState) send() {
	defer close(st.done)
	for {
		select {
		case <-st.stop:
			return
		case <-st.wake:
		}
		for {
			w := st.next()
			if w == nil {
				break
			}
			stopped, delivered := false, false
			select {
			case w.out <- w.resp:
				delivered = true
			case <-w.canceled:
			case <-st.stop:
				stopped = true
			}
			st.mu.Lock()
			if !delivered {
				st.takeBack(w)
			}
			w.undo, w.resp = nil, nil // done with them; the watch stays answered
			st.mu.Unlock()
			close(w.finished)
			if stopped {
				return
			}
		}
	}
}

// next takes the first queued watch off the queue and counts its response in what the zone
// holds, or returns nil.
func (st *streamState) next() *watch {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.queue) == 0 {
		return nil
	}
	w := st.queue[0]
	st.queue = st.queue[1:]
	w.sending = true
	ks := st.kind(w.kind)
	w.undo = nil
	resp := w.resp.DeltaDiscoveryResponse
	if len(ks.known) == 0 && len(resp.Resources) > 8 {
		ks.known = make(map[string]string, len(resp.Resources)) // the first response: one allocation
	}
	w.eachName(func(name string) {
		if old, had := ks.known[name]; had {
			w.undo = append(w.undo, prior{name, old})
		}
	})
	for _, r := range resp.Resources {
		ks.known[r.Name] = r.Version
	}
	for _, n := range resp.RemovedResources {
		delete(ks.known, n)
	}
	for _, n := range w.forced {
		delete(ks.forced, n)
	}
	return w
}

// takeBack undoes a response that was not delivered: what the zone holds is as before, and its
// names are dirty again (forced ones forced again). Call with the stream's lock.
func (st *streamState) takeBack(w *watch) {
	ks := st.kind(w.kind)
	w.eachName(func(name string) { delete(ks.known, name) })
	for _, p := range w.undo {
		ks.known[p.name] = p.version
	}
	st.requeue(w)
	for _, n := range w.forced {
		ks.forced[n] = true
	}
}

// requeue makes the names of an answered, undelivered response dirty again. Call with the
// stream's lock.
func (st *streamState) requeue(w *watch) {
	ks := st.kind(w.kind)
	w.eachName(func(name string) { ks.dirty[name] = true })
}

// eachName calls f with every name the watch's response carries, sent or removed.
func (w *watch) eachName(f func(name string)) {
	for _, r := range w.resp.DeltaDiscoveryResponse.Resources {
		f(r.Name)
	}
	for _, n := range w.resp.DeltaDiscoveryResponse.RemovedResources {
		f(n)
	}
}
