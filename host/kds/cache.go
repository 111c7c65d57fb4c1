package kds

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/kds-host/kds-host/host/shrink"
)

// Filter decides, per zone, which entries of a snapshot enter that zone's view (owner holds). An
// entry it hides is not sent; a zone that already has an older version of it keeps that one. It
// is called with the cache's lock held and must not block.
type Filter interface {
	Visible(zone string, e *Entry) bool
}

// Cache is the ConfigWatcher behind the delta server: it answers each stream's watches from the
// current Snapshot, as seen through the zone's Filter, and lets the retry scheduler force names
// to be sent again.
//
// It avoids two flaws of go-control-plane's stock caches. It never sends on a stream's response
// channel while holding a lock, or from the stream's own goroutine: each stream has one sender
// goroutine that feeds the channel in order (so with 32 kinds or more nothing deadlocks on the
// channel's 20 slots, go-control-plane issue 875). And since the delta server marks a resource
// as known when it is sent and never resends after a NACK, the cache keeps per stream the names
// the retry scheduler forces, and treats them as unknown to the zone until they are sent again.
type Cache struct {
	kinds []string // kind order: owners first; responses that are ready together go in this order

	mu       sync.Mutex
	snap     *Snapshot
	filter   Filter
	streams  map[int64]*streamState
	requests map[*discovery.DeltaDiscoveryRequest]int64 // request -> stream, set by the callbacks
	version  int64
	peak     shrink.Peak // of streams
}

// NewCache returns a cache for the given kinds, in owner-first order.
func NewCache(kinds []string) *Cache {
	return &Cache{kinds: kinds, snap: &Snapshot{}, streams: map[int64]*streamState{}, requests: map[*discovery.DeltaDiscoveryRequest]int64{}}
}

// streamState is one zone stream's watches and forced names, and the goroutine that sends its
// responses.
type streamState struct {
	cache   *Cache
	id      int64
	zone    string
	watches map[string]*watch          // by kind
	forced  map[string]map[string]bool // kind -> names to send although the zone "knows" them
	synced  map[string]syncPoint       // by kind: what needs no response (see syncPoint)
	queue   []*watch                   // responses waiting for the sender, in order
	wake    chan struct{}              // capacity 1: the queue grew
	stop    chan struct{}              // closed when the stream closes
	done    chan struct{}              // closed when the sender has returned
}

// syncPoint is a state of one kind on one stream that needs no response: the zone knows the
// versions in known (the very map, as the delta server hands it to the watch), and the snapshot's
// entries of the kind are the very map entries. It is recorded when an evaluation found nothing
// to send, or answered a watch (then known is the response's next version map, which the server
// hands to the watch after the zone's ACK or NACK). A new watch at a sync point needs no
// evaluation: that is what makes an ACK cost nothing on a kind of 10,000 entries. Both maps are
// immutable while recorded (a snapshot's maps always; the subscription's returned map until a
// request subscribes or unsubscribes names, which is never taken at a sync point), and holding
// them keeps their identity from being reused. Forced names and the filter's answers are not part
// of it: Refresh drops the sync points it touches, and a watch at a sync point looks at the names
// forced on its kind.
type syncPoint struct {
	known   map[string]string
	entries map[string]*Entry
}

// at reports whether a watch knowing known, with entries served, is at the sync point.
func (p syncPoint) at(known map[string]string, entries map[string]*Entry) bool {
	return p.known != nil && sameMap(p.known, known) && sameMap(p.entries, entries)
}

// sameMap reports whether a and b are the same map, not merely equal ones.
func sameMap[K comparable, V any](a, b map[K]V) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// watch is one open delta watch: the server's request for a kind, answered at most once.
type watch struct {
	kind string
	req  *discovery.DeltaDiscoveryRequest
	sub  cache.Subscription
	out  chan cache.DeltaResponse

	resp     *cache.DeltaPassthroughResponse // set once answered
	forced   []string                        // forced names the response carries
	canceled chan struct{}                   // closed by cancel
	finished chan struct{}                   // closed by the sender when it is done with this watch
	sending  bool                            // the sender has taken it off the queue
}

// SetSnapshot replaces what is served and answers every open watch that now has something new.
//
// Every open, unanswered watch is in step with the snapshot served: its last evaluation, against
// that snapshot, found nothing to send. So when s was derived from the snapshot served
// (SnapshotBuilder.Update), only the names that changed can make a difference: watches of
// other kinds are left alone, and a watch of a changed kind looks at the changed names only.
// Otherwise every watch is evaluated in full.
func (c *Cache) SetSnapshot(s *Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed, delta := s.changesFrom(c.snap)
	c.snap = s
	c.version++
	for _, st := range c.streams {
		if !delta {
			c.evaluateLocked(st)
			continue
		}
		for _, kind := range c.kinds {
			if w, names := st.watches[kind], changed[kind]; w != nil && len(names) > 0 {
				c.evaluateNamesLocked(st, w, names)
			}
		}
	}
}

// SetFilter installs the per-zone filter (nil: every zone sees everything).
func (c *Cache) SetFilter(f Filter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.filter = f
}

// Refresh re-evaluates the named entries (kind -> xDS names) of a zone's open watches, after the
// filter's answer changed for them (and for no other entry): the watches are in step with every
// other name already.
func (c *Cache) Refresh(zone string, names map[string][]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.streams {
		if st.zone != zone {
			continue
		}
		for _, kind := range c.kinds {
			ns := names[kind]
			if len(ns) == 0 {
				continue
			}
			delete(st.synced, kind)
			if w := st.watches[kind]; w != nil {
				c.evaluateNamesLocked(st, w, ns)
			}
		}
	}
}

// Snapshot returns what is served now.
func (c *Cache) Snapshot() *Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snap
}

// Resend makes the stream send the named resources of each kind again, although the zone was
// already sent their current version (it rejected them). Names no longer served are ignored.
// Only the named names of the named kinds are looked at: every open watch is in step with the
// snapshot for every other name.
func (c *Cache) Resend(streamID int64, names map[string][]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.streams[streamID]
	if st == nil {
		return
	}
	for _, kind := range c.kinds {
		ns := names[kind]
		if len(ns) == 0 {
			continue
		}
		st.force(kind, ns)
		if w := st.watches[kind]; w != nil {
			c.evaluateNamesLocked(st, w, ns)
		}
	}
}

// bindRequest tells the cache which stream a request belongs to, and which names of its kind
// to send again although the zone knows them (a re-request); the delta server calls the request
// callback and then CreateDeltaWatch with the same request, on the stream's goroutine.
func (c *Cache) bindRequest(streamID int64, zone string, req *discovery.DeltaDiscoveryRequest, again []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests[req] = streamID
	st := c.streams[streamID]
	if st == nil {
		st = c.openStreamLocked(streamID, zone)
	}
	if len(again) > 0 {
		st.force(req.GetTypeUrl(), again)
	}
}

// force marks names of kind to be sent although the zone knows them. Call with the cache's lock.
func (st *streamState) force(kind string, names []string) {
	set := st.forced[kind]
	if set == nil {
		set = map[string]bool{}
		st.forced[kind] = set
	}
	for _, n := range names {
		set[n] = true
	}
}

func (c *Cache) openStreamLocked(id int64, zone string) *streamState {
	st := &streamState{
		cache: c, id: id, zone: zone,
		watches: map[string]*watch{}, forced: map[string]map[string]bool{}, synced: map[string]syncPoint{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	c.streams[id] = st
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
	defer c.mu.Unlock()
	id, ok := c.requests[req]
	if !ok {
		return nil, errors.New("kds: request was not seen by the stream callbacks")
	}
	delete(c.requests, req)
	st := c.streams[id]
	if st == nil {
		return nil, errors.New("kds: the request's stream is closed")
	}
	w := &watch{kind: req.GetTypeUrl(), req: req, sub: sub, out: out, canceled: make(chan struct{}), finished: make(chan struct{})}
	st.watches[w.kind] = w
	// The request after a response (its ACK or NACK) finds the zone at the sync point the
	// response recorded, unless the snapshot changed meanwhile or the request changes the
	// subscription.
	// Names forced meanwhile are not part of a sync point, nor are names a request subscribes
	// (a re-request, or a new name of a named subscription): those alone are looked at then.
	// Unsubscribing changes what the zone knows: that takes a full evaluation.
	subscribed := req.GetResourceNamesSubscribe()
	switch {
	case len(req.GetResourceNamesUnsubscribe()) > 0 || slices.Contains(subscribed, "*") ||
		!st.synced[w.kind].at(sub.ReturnedResources(), c.snap.Kind(w.kind)):
		c.evaluateWatchLocked(st, w)
	case len(st.forced[w.kind]) > 0 || len(subscribed) > 0:
		names := maps.Clone(st.forced[w.kind])
		if names == nil {
			names = map[string]bool{}
		}
		for _, n := range subscribed {
			names[n] = true
		}
		c.evaluateNamesLocked(st, w, slices.Collect(maps.Keys(names)))
	}
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
	c.mu.Lock()
	if st.watches[w.kind] == w {
		delete(st.watches, w.kind)
	}
	select {
	case <-w.canceled:
		c.mu.Unlock()
		return
	default:
	}
	close(w.canceled)
	wait := w.sending
	if i := slices.Index(st.queue, w); i >= 0 {
		st.queue = slices.Delete(st.queue, i, i+1)
	}
	c.mu.Unlock()
	if wait {
		<-w.finished
	}
}

// evaluateLocked answers every open, unanswered watch of the stream that has something to send,
// in kind order.
func (c *Cache) evaluateLocked(st *streamState) {
	for _, kind := range c.kinds {
		if w := st.watches[kind]; w != nil {
			c.evaluateWatchLocked(st, w)
		}
	}
}

// evaluateWatchLocked computes the delta between what the zone knows (the subscription's
// returned resources, less the forced names) and the zone's view of the snapshot; when it is not
// empty, the watch is answered and queued for the sender.
func (c *Cache) evaluateWatchLocked(st *streamState, w *watch) {
	if w.resp != nil {
		return
	}
	known, forced := w.sub.ReturnedResources(), st.forced[w.kind]
	resp := c.response(w.kind)
	next := make(map[string]string, len(known))
	var sentForced []string
	for name, e := range c.snap.Kind(w.kind) {
		if !w.subscribes(name) {
			continue
		}
		if c.filter != nil && !c.filter.Visible(st.zone, e) {
			// Held back: the zone keeps what it has (no update, and no removal either).
			if v, ok := known[name]; ok {
				next[name] = v
			}
			continue
		}
		next[name] = e.Version
		v, ok := known[name]
		if ok && v == e.Version && !forced[name] {
			continue
		}
		resp.Resources = append(resp.Resources, &discovery.Resource{Name: name, Version: e.Version, Resource: e.Any})
		if forced[name] {
			sentForced = append(sentForced, name)
		}
	}
	for name := range known {
		if _, ok := next[name]; !ok {
			resp.RemovedResources = append(resp.RemovedResources, name)
		}
	}
	for name := range forced {
		if _, ok := next[name]; !ok {
			delete(forced, name) // no longer served: nothing to resend
		}
	}
	if len(resp.Resources) == 0 && len(resp.RemovedResources) == 0 {
		st.synced[w.kind] = syncPoint{known: known, entries: c.snap.Kind(w.kind)}
		return
	}
	c.answerLocked(st, w, resp, next, sentForced)
}

// evaluateNamesLocked is evaluateWatchLocked for a watch in step with the previous snapshot,
// when the current one differs from it only in names: each name is judged as
// evaluateWatchLocked would judge it, and the other names stay as the zone knows them.
func (c *Cache) evaluateNamesLocked(st *streamState, w *watch, names []string) {
	if w.resp != nil {
		return
	}
	known, forced := w.sub.ReturnedResources(), st.forced[w.kind]
	entries := c.snap.Kind(w.kind)
	resp := c.response(w.kind)
	var sentForced []string
	for _, name := range names {
		v, isKnown := known[name]
		e, served := entries[name]
		served = served && w.subscribes(name)
		switch {
		case served && c.filter != nil && !c.filter.Visible(st.zone, e):
			// Held back: the zone keeps what it has.
			if !isKnown {
				delete(forced, name) // not served to this zone: nothing to resend
			}
		case served:
			if isKnown && v == e.Version && !forced[name] {
				continue
			}
			resp.Resources = append(resp.Resources, &discovery.Resource{Name: name, Version: e.Version, Resource: e.Any})
			if forced[name] {
				sentForced = append(sentForced, name)
			}
		default:
			delete(forced, name)
			if isKnown {
				resp.RemovedResources = append(resp.RemovedResources, name)
			}
		}
	}
	if len(resp.Resources) == 0 && len(resp.RemovedResources) == 0 {
		st.synced[w.kind] = syncPoint{known: known, entries: entries}
		return
	}
	next := maps.Clone(known)
	if next == nil {
		next = map[string]string{}
	}
	for _, r := range resp.Resources {
		next[r.Name] = r.Version
	}
	for _, name := range resp.RemovedResources {
		delete(next, name)
	}
	c.answerLocked(st, w, resp, next, sentForced)
}

// response starts a response of kind.
func (c *Cache) response(kind string) *discovery.DeltaDiscoveryResponse {
	return &discovery.DeltaDiscoveryResponse{TypeUrl: kind, SystemVersionInfo: strconv.FormatInt(c.version, 10)}
}

// subscribes reports whether the watch's subscription covers name.
func (w *watch) subscribes(name string) bool {
	if w.sub.IsWildcard() {
		return true
	}
	_, ok := w.sub.SubscribedResources()[name]
	return ok
}

// answerLocked answers the watch with resp, after which the zone knows next, and queues it for
// the sender.
func (c *Cache) answerLocked(st *streamState, w *watch, resp *discovery.DeltaDiscoveryResponse, next map[string]string, sentForced []string) {
	slices.SortFunc(resp.Resources, func(a, b *discovery.Resource) int { return strings.Compare(a.Name, b.Name) })
	slices.Sort(resp.RemovedResources)
	w.resp = &cache.DeltaPassthroughResponse{DeltaRequest: w.req, NextVersionMap: next, DeltaDiscoveryResponse: resp}
	w.forced = sentForced
	st.synced[w.kind] = syncPoint{known: next, entries: c.snap.Kind(w.kind)}
	st.queue = append(st.queue, w)
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// send is the stream's sender: it feeds queued responses into the server's channel in order.
// A watch canceled while its response waits is dropped; cancel waits for a send in progress.
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
			stopped := false
			select {
			case w.out <- w.resp:
				st.sent(w)
			case <-w.canceled:
			case <-st.stop:
				stopped = true
			}
			close(w.finished)
			if stopped {
				return
			}
		}
	}
}

// next takes the first queued watch off the queue, or returns nil.
func (st *streamState) next() *watch {
	st.cache.mu.Lock()
	defer st.cache.mu.Unlock()
	if len(st.queue) == 0 {
		return nil
	}
	w := st.queue[0]
	st.queue = st.queue[1:]
	w.sending = true
	return w
}

// sent clears the forced names a delivered response carried.
func (st *streamState) sent(w *watch) {
	if len(w.forced) == 0 {
		return
	}
	st.cache.mu.Lock()
	defer st.cache.mu.Unlock()
	set := st.forced[w.kind]
	for _, n := range w.forced {
		delete(set, n)
	}
	if len(set) == 0 {
		delete(st.forced, w.kind)
	}
}
