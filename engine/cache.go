package engine

import (
	"cmp"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/internal/shrink"
)

// Cache is the ConfigWatcher behind the xDS servers and the registry of their sessions: it
// answers each stream's watches from the current Snapshot, as the node's View shows it
// (UseViews), and lets the retry scheduler force names to be sent again.
type Cache struct {
	kinds  []string       // the type URLs served, in the order that responses ready together go in
	kindAt map[string]int // type URL -> its place in kinds

	budget          *budget                     // bytes of the responses in flight, across streams
	maxMessage      atomic.Int64                // bytes of one response at most (Limits.MaxMessage)
	maxUnknown      atomic.Int64                // names a stream may hold that the snapshot does not (Limits.MaxUnknownNames)
	responseTimeout atomic.Int64                // a time.Duration (Limits.ResponseTimeout; <= 0: for ever)
	onStall         func(event.Refusal)         // tells of a stream closed for a stalled response (set before serving)
	onUnbound       atomic.Pointer[func(error)] // OnUnbound
	withholder      Withholder                  // reference holds (SetWithholder, before serving); nil: none
	snap            atomic.Pointer[Snapshot]
	version         atomic.Pointer[string]        // the snapshot's number, as responses carry it (system_version_info)
	versions        atomic.Int64                  // snapshots set so far
	answers         atomic.Pointer[sharedAnswers] // the snapshot's responses shared by every stream (codec.go)
	views           atomic.Bool                   // each session sees only its published View (UseViews)
	nodeSnaps       atomic.Bool                   // each session sees only its node's snapshot (UseNodeSnapshots)
	anyType         bool                          // a type URL not in kinds is served too (ServeAnyType, before serving)

	mu           sync.Mutex // guards the maps below; never held while a session's lock is
	streams      map[int64]*Session
	order        []*Session                                    // streams by connection (fanOutOrder); nil once they changed
	byNode       map[string]*Session                           // each node's current (admitted) session
	budgets      map[string]*tokenBucket                       // each node's re-request budget, until ForgetNode
	perNode      map[string]*Snapshot                          // each node's own snapshot (SetNodeSnapshot)
	requests     map[*discovery.DeltaDiscoveryRequest]*Session // set by the callbacks, taken by CreateDeltaWatch
	sotwRequests map[*discovery.DiscoveryRequest]*Session      // likewise, taken by CreateWatch
	peak         shrink.Peak                                   // of streams
	zonePeak     shrink.Peak                                   // of byNode
}

// View is what one node may see of the snapshot, published into its session (Cache.Publish). An
// entry it hides is not sent; a node that has an older version keeps that one. It is read-only.
type View interface {
	// Visible reports whether the node may see e.
	Visible(e *Entry) bool
	// None reports that the node may see nothing at all yet (its filter has not decided yet).
	None() bool
	// SeesAll reports that Visible would be true of every entry of snap.
	SeesAll(snap *Snapshot) bool
	// Seq orders the views of one node: a later one has a larger Seq.
	Seq() uint64
}

// Publish puts v in the node's current session, unless the session has a later view already.
func (c *Cache) Publish(node string, v View) {
	if st := c.Current(node); st != nil {
		st.publish(v)
	}
}

// NewCache returns a cache that serves the given type URLs. Responses that are ready together go
// in this order (kds-host: owner types first).
func NewCache(typeURLs []string) *Cache {
	c := &Cache{kinds: typeURLs, kindAt: make(map[string]int, len(typeURLs)), budget: newBudget(DefaultLimits().MaxInFlightBytes), streams: map[int64]*Session{}, byNode: map[string]*Session{},
		budgets: map[string]*tokenBucket{}, perNode: map[string]*Snapshot{},
		requests: map[*discovery.DeltaDiscoveryRequest]*Session{}, sotwRequests: map[*discovery.DiscoveryRequest]*Session{}}
	for i, k := range typeURLs {
		c.kindAt[k] = i
	}
	c.snap.Store(&Snapshot{})
	c.maxMessage.Store(int64(DefaultLimits().MaxMessage))
	c.maxUnknown.Store(int64(DefaultLimits().MaxUnknownNames))
	return c
}

// SetSnapshot replaces what is served and answers every open watch that now has something new:
// at the changed names only when s was derived from the snapshot served (Snapshot.Update).
func (c *Cache) SetSnapshot(s *Snapshot) {
	changed, delta := s.ChangesFrom(c.snap.Load())
	v := strconv.FormatInt(c.versions.Add(1), 10)
	if delta {
		c.answers.Store(shareAnswers(s, v, c.kinds, changed))
	} else {
		c.answers.Store(nil)
	}
	c.snap.Store(s)
	c.version.Store(&v)
	c.mu.Lock()
	if c.order == nil {
		c.order = fanOutOrder(c.streams)
	}
	streams := c.order
	c.mu.Unlock()
	kinds := c.changedKinds(changed, delta)
	if c.nodeSnaps.Load() {
		return // every session reads its node's snapshot
	}
	c.fanOut(streams, func(st *Session) {
		st.mu.Lock()
		if st.own.Load() != nil {
			st.mu.Unlock()
			return // it reads its node's snapshot
		}
		c.answerSession(st, kinds, changed, delta)
	})
}

// answerSession makes a write's changed names of the types at kinds (every name unless delta)
// dirty for st, answers its watches, and has what it queued sent. Call with st.mu; it releases it.
func (c *Cache) answerSession(st *Session, kinds []int, changed map[string][]string, delta bool) {
	st.deferWake = true
	for _, i := range kinds {
		if ks := st.kinds.known[i]; ks != nil { // nil: not subscribed
			c.answerKind(st, ks, changed[c.kinds[i]], delta)
		}
	}
	for kind, ks := range st.kinds.other { // ServeAnyType's
		if !delta || len(changed[kind]) > 0 {
			c.answerKind(st, ks, changed[kind], delta)
		}
	}
	st.deferWake = false
	queued, sendNow, kick := len(st.queue) > 0, st.sendNow, st.kick
	if queued && kick == nil {
		st.signal()
	}
	st.mu.Unlock()
	// A stream of the engine's own loop in step sends its answer on this goroutine.
	if queued && kick != nil && !sendNow() {
		kick()
	}
}

// UseNodeSnapshots makes each session see only its node's snapshot (SetNodeSnapshot), and
// nothing until one is set. Call it before serving.
func (c *Cache) UseNodeSnapshots() { c.nodeSnaps.Store(true) }

// SetNodeSnapshot replaces what node's sessions see, instead of the snapshot SetSnapshot sets
// (nil: they see that one again; with UseNodeSnapshots, nothing), and answers the node's open
// watches as SetSnapshot does. Calls for one node must not run concurrently.
func (c *Cache) SetNodeSnapshot(node string, s *Snapshot) {
	c.mu.Lock()
	st := c.setOwnLocked(node, s)
	c.mu.Unlock()
	if st != nil {
		c.answerOwn(st, s)
	}
}

// setOwnLocked makes s node's own snapshot (nil: none), and returns its session. Call with c.mu.
func (c *Cache) setOwnLocked(node string, s *Snapshot) *Session {
	if s == nil {
		delete(c.perNode, node)
	} else {
		c.perNode[node] = s
	}
	return c.byNode[node]
}

// answerOwn makes s st's own snapshot, and answers its watches with what changed.
func (c *Cache) answerOwn(st *Session, s *Snapshot) {
	st.mu.Lock()
	changed, delta := s.ChangesFrom(st.own.Load())
	st.own.Store(s)
	c.answerSession(st, c.changedKinds(changed, delta), changed, delta)
}

// SetNodesSnapshot is SetNodeSnapshot of s for each of nodes at once: their sessions are
// answered one goroutine a core, the streams of one connection together. Calls for one node must
// not run concurrently.
func (c *Cache) SetNodesSnapshot(nodes []string, s *Snapshot) {
	byNode := make(map[int64]*Session, len(nodes))
	c.mu.Lock()
	for _, n := range nodes {
		if st := c.setOwnLocked(n, s); st != nil {
			byNode[st.id] = st
		}
	}
	c.mu.Unlock()
	c.fanOut(fanOutOrder(byNode), func(st *Session) { c.answerOwn(st, s) })
}

// changedKinds is the places in c.kinds of the types a write changed (every type unless delta).
func (c *Cache) changedKinds(changed map[string][]string, delta bool) []int {
	kinds := make([]int, 0, len(c.kinds))
	for i, k := range c.kinds {
		if !delta || len(changed[k]) > 0 {
			kinds = append(kinds, i)
		}
	}
	return kinds
}

// answerKind is answerSession of one type, whose changed names are changed. Call with st.mu.
func (c *Cache) answerKind(st *Session, ks *kindState, changed []string, delta bool) {
	var names []string
	switch {
	case !delta:
		ks.full = true
	case len(ks.dirty) == 0 && !ks.full && ks.watch != nil && !ks.watch.answered:
		names = changed // a stream in step: no need to make them dirty first
	default:
		for _, n := range changed {
			ks.markDirty(n)
		}
	}
	c.evaluateLocked(st, ks, names)
}

// ServeAnyType makes the cache serve type URLs it was not made for too. Call it before serving.
func (c *Cache) ServeAnyType() { c.anyType = true }

// serves reports whether the cache serves typeURL.
func (c *Cache) serves(typeURL string) bool {
	_, ok := c.kindAt[typeURL]
	return ok || c.anyType
}

// fanOutOrder lists the streams for a write's fan-out, the streams of one connection together.
func fanOutOrder(streams map[int64]*Session) []*Session {
	return slices.SortedFunc(maps.Values(streams), func(a, b *Session) int {
		return cmp.Or(strings.Compare(a.info.conn, b.info.conn), cmp.Compare(a.id, b.id))
	})
}

// fanOut runs f on every stream, one goroutine a core, and returns when all are done.
func (c *Cache) fanOut(streams []*Session, f func(*Session)) {
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

// versionInfo is the snapshot's number, as responses carry it ("0" before the first).
func (c *Cache) versionInfo() string {
	if v := c.version.Load(); v != nil {
		return *v
	}
	return "0"
}

// UseViews(true) makes each session see only what the View published into it shows (Publish),
// and nothing before its first; UseViews(false), the default, shows the whole snapshot.
func (c *Cache) UseViews(on bool) { c.views.Store(on) }

// Refresh re-evaluates the named entries (type URL -> xDS names) of a node's streams, after its
// View's answer changed for them (and for no other entry).
func (c *Cache) Refresh(node string, names map[string][]string) {
	if st := c.Current(node); st != nil {
		st.mark(names, false)
	}
}

// Current is the session of the stream the node was admitted on last, while open.
func (c *Cache) Current(node string) *Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byNode[node]
}

// Session is the session of a stream, while open.
func (c *Cache) Session(streamID int64) *Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[streamID]
}

// Snapshot returns what is served now.
func (c *Cache) Snapshot() *Snapshot { return c.snap.Load() }

// NodeSnapshot returns the node's own snapshot (SetNodeSnapshot; nil: none), and whether every
// node sees its own only (UseNodeSnapshots).
func (c *Cache) NodeSnapshot(node string) (snap *Snapshot, only bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.perNode[node], c.nodeSnaps.Load()
}

// Resend makes the stream send the named resources (type URL -> xDS names) again, although the
// node was already sent their current version. Names no longer served are ignored.
func (c *Cache) Resend(streamID int64, names map[string][]string) {
	if st := c.Session(streamID); st != nil {
		st.Resend(names)
	}
}

// mark makes names (type URL -> names) dirty, forced too when force, and answers the watches.
func (st *Session) mark(names map[string][]string, force bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	kinds := st.cache.kinds
	for kind := range names {
		if _, ok := st.cache.kindAt[kind]; !ok && st.cache.anyType {
			kinds = append(slices.Clip(kinds), kind) // ServeAnyType's, after the cache's own
		}
	}
	for _, kind := range kinds {
		ns := names[kind]
		if len(ns) == 0 {
			continue
		}
		ks := st.kind(kind)
		if !force && 2*len(ns) >= len(st.snapshot().Type(kind)) {
			ks.full = true // most of the type (a filter releasing what waited): one walk
		} else {
			for _, n := range ns {
				ks.markDirty(n)
				if force {
					ks.markForced(n)
				}
			}
		}
		st.cache.evaluateLocked(st, ks, nil)
	}
}

// bindRequest tells the cache which session a request belongs to (for CreateDeltaWatch), and
// which names of its type to send again although the node was sent them (a re-request).
func (c *Cache) bindRequest(st *Session, req *discovery.DeltaDiscoveryRequest, again []string) {
	if !st.info.loop { // the engine's own loop calls openWatch with the session
		c.mu.Lock()
		c.requests[req] = st
		c.mu.Unlock()
	}
	if len(again) > 0 {
		st.mu.Lock()
		ks := st.kind(req.GetTypeUrl())
		for _, n := range again {
			ks.markDirty(n)
			ks.markForced(n)
		}
		st.mu.Unlock()
	}
}

// openSession starts the session of a new stream.
func (c *Cache) openSession(id int64, info *streamInfo, sotw bool) *Session {
	st := newSession(c, id, info, sotw)
	c.budget.opened()
	c.mu.Lock()
	c.streams[id] = st
	c.order = nil
	c.mu.Unlock()
	return st
}

// admit makes st the node's current session, when the limits allow, and returns the session
// it replaces (nil if none). zone is the node id, already checked against the credentials.
func (c *Cache) admit(st *Session, zone string, maxZones int) (replaced *Session, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, connected := c.byNode[zone]
	if !connected && len(c.byNode) >= maxZones {
		return nil, status.Errorf(codes.ResourceExhausted, "the global serves %d zones already, its limit (--max-zones)", len(c.byNode))
	}
	c.byNode[zone] = st
	b := c.budgets[zone]
	if b == nil {
		b = &tokenBucket{}
		c.budgets[zone] = b
	}
	own := c.perNode[zone]
	st.mu.Lock()
	st.node, st.reRequests = zone, b
	if own != nil {
		st.own.Store(own)
	}
	st.mu.Unlock()
	return old, nil
}

// ForgetNode frees the node's re-request budget, once its grace after its last stream is over.
func (c *Cache) ForgetNode(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, connected := c.byNode[node]; !connected {
		delete(c.budgets, node)
	}
}

// closeStream frees a stream's session and stops its sender; the session stays readable.
func (c *Cache) closeStream(id int64) *Session {
	c.mu.Lock()
	st := c.streams[id]
	delete(c.streams, id)
	c.streams = shrink.Map(c.streams, &c.peak)
	c.order = nil
	if st != nil && c.byNode[st.node] == st {
		delete(c.byNode, st.node)
		c.byNode = shrink.Map(c.byNode, &c.zonePeak)
	}
	// Bound, but their watches were never created.
	maps.DeleteFunc(c.requests, func(_ *discovery.DeltaDiscoveryRequest, s *Session) bool { return s == st })
	maps.DeleteFunc(c.sotwRequests, func(_ *discovery.DiscoveryRequest, s *Session) bool { return s == st })
	if len(c.requests) == 0 {
		c.requests = map[*discovery.DeltaDiscoveryRequest]*Session{} // it is empty between requests
	}
	c.mu.Unlock()
	if st != nil {
		st.retry.Close()
		st.mu.Lock()
		st.closing = true
		st.mu.Unlock()
		close(st.stop)
		st.senders.Wait()
		st.mu.Lock()
		st.stall.stop()
		for _, r := range st.inflight {
			c.budget.release(&st.acct, r.cost) // nothing will answer them
			r.cost = 0
		}
		st.mu.Unlock()
		c.budget.closed()
		st.release()
	}
	return st
}

// Close ends every stream: those of DeltaADS with codes.Unavailable.
func (c *Cache) Close() {
	c.mu.Lock()
	ids := make([]int64, 0, len(c.streams))
	for id, st := range c.streams {
		ids = append(ids, id)
		if st.info.loop { // the node is told why
			st.info.close(status.Error(codes.Unavailable, "the control plane is stopping"))
		}
	}
	c.mu.Unlock()
	for _, id := range ids {
		c.closeStream(id)
	}
}

// CreateDeltaWatch implements cache.ConfigWatcher. It never blocks.
func (c *Cache) CreateDeltaWatch(req *discovery.DeltaDiscoveryRequest, sub cache.Subscription, out chan cache.DeltaResponse) (func(), error) {
	st, err := takeBound(c, c.requests, req)
	if err != nil {
		return nil, err
	}
	w := c.openWatch(st, req, sub, out, nil)
	return func() { c.cancel(st, w) }, nil
}

// openWatch opens a watch of st, which cancel closes. old (nil: none) is the type's watch the
// engine's own stream loop has just canceled, reused when its response is no longer in flight.
func (c *Cache) openWatch(st *Session, req *discovery.DeltaDiscoveryRequest, sub cache.Subscription, out chan cache.DeltaResponse, old *watch) *watch {
	st.mu.Lock()
	defer st.mu.Unlock()
	w := old
	if old == nil || slices.Contains(st.inflight, &old.record) {
		w = new(watch)
	}
	ks := st.kind(req.GetTypeUrl())
	*w = watch{kind: req.GetTypeUrl(), ks: ks, req: req, sub: sub, out: out}
	if !st.info.loop { // cancel and the sender goroutine signal each other
		w.canceled, w.finished = make(chan struct{}), make(chan struct{})
	}
	if !ks.started { // initial_resource_versions: the node has them, as if ACKed
		ks.started, ks.full = true, true
		for n, v := range sub.ReturnedResources() {
			r := versionOnly(n, v)
			if e := st.snapshot().Type(w.kind)[n]; e != nil && e.Version == v {
				r = e.Wire // the version served: shared, as if sent
			}
			st.setView(w.kind, n, func() { ks.setDelivered(n, r) })
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		// A wildcard watch tells the node whether the name is still there; another forgets it.
		if sub.IsWildcard() {
			had := st.ackedLocked(w.kind, n)
			ks.setDelivered(n, unknownVersion)
			ks.markDirty(n)
			ks.setRefused(n, had) // it still holds what it had
		} else {
			st.setView(w.kind, n, func() { ks.dropDelivered(n); delete(ks.refused, n) })
		}
	}
	for _, n := range req.GetResourceNamesSubscribe() {
		if n == "*" {
			ks.full = true
		}
		ks.markDirty(n) // a re-request, or a new name of a named subscription
	}
	c.watchLocked(st, ks, w)
	return w
}

// watchLocked makes w the type's open watch and evaluates it. Call with st.mu.
func (c *Cache) watchLocked(st *Session, ks *kindState, w *watch) {
	ks.watch = w
	if c.withholder != nil || c.views.Load() {
		ks.sub = w.sub // for ClientView.Asks and Session.Asks
	}
	c.evaluateLocked(st, ks, nil)
}

func (c *Cache) cancel(st *Session, w *watch) {
	st.mu.Lock()
	if ks := w.ks; ks.watch == w {
		ks.watch = nil
	}
	if w.wasCanceled {
		st.mu.Unlock()
		return
	}
	w.wasCanceled = true
	wait := w.sending && w.finished != nil
	if w.canceled != nil {
		close(w.canceled)
	}
	if i := slices.Index(st.queue, w); i >= 0 {
		st.queue = slices.Delete(st.queue, i, i+1)
		st.requeue(w) // never delivered: its names are dirty again
	}
	st.mu.Unlock()
	if wait {
		<-w.finished // the sender takes it back if it was not delivered
	}
}

// evaluateLocked answers the type's open, unanswered watch when the node's view of the snapshot
// differs from what the node holds in a dirty name, or in one of names (more dirty names, not in
// ks.dirty), or in any name when full. Call with st.mu.
func (c *Cache) evaluateLocked(st *Session, ks *kindState, names []string) {
	w := ks.watch
	if w == nil || w.answered || (!ks.full && len(ks.dirty) == 0 && len(names) == 0) {
		return
	}
	snap := st.snapshot()
	if snap == nil || (snap.declared && !snap.Has(w.kind) && ks.delivered.len() == 0) {
		// Its node's snapshot, or its type in it, is not set yet: the watch stays open.
		for _, n := range names {
			ks.markDirty(n)
		}
		return
	}
	entries := snap.Type(w.kind)
	var visible func(*Entry) bool // nil: everything
	if c.views.Load() {
		v := st.view.Load()
		if v == nil || v.View.None() {
			if ks.delivered.len() == 0 { // nothing to send or remove: wait for Refresh
				for _, n := range names {
					ks.markDirty(n)
				}
				return
			}
			visible = func(*Entry) bool { return false }
		} else if !v.View.SeesAll(snap) {
			visible = v.View.Visible
		}
	}
	resources := w.answer.res[:0]
	// What does not fit under the message limit is left dirty, for the next watch (rest); one
	// resource always goes.
	limit, size := int(c.maxMessage.Load()), 0
	var removed, sentForced, rest []string
	var order *kindOrder // the type in name order, when every name is looked at (full)
	all := false         // the response is all of the type, as the walk below would find it
	if ks.full {
		order = snap.order(w.kind)
		if ks.delivered.len() == 0 { // a first sync
			all = visible == nil && c.withholder == nil && len(ks.forced) == 0 && w.sub.IsWildcard() && (order.size <= limit || len(order.wires) == 1)
			if !all {
				resources = make([]*discovery.Resource, 0, len(entries)) // most often all of them
			}
		}
	}
	fits := func(name string, n int) bool {
		if len(rest) > 0 || (size+n > limit && len(resources)+len(removed) > 0) {
			rest = append(rest, name)
			return false
		}
		size += n
		return true
	}
	wh := c.withholder
	cv := sessionView{s: st, snap: snap}
	withheld := false // something of the type is held back from the node
	look := func(name string, e *Entry) {
		d, isKnown := ks.delivered.get(name)
		served := e != nil && w.subscribes(name)
		switch {
		case served && isKnown && (d == e.Wire || d.Version == e.Version) && !ks.forced[name]:
			ks.unhold(name) // the node has it
		case served && visible != nil && !visible(e): // the node keeps what it has
			withheld = true
			if !isKnown {
				delete(ks.forced, name) // not served to this node: nothing to resend
			}
		case served:
			if wh != nil {
				why, instead := wh.Withhold(cv, e)
				if why == "" {
					ks.unhold(name)
				} else {
					ks.hold(name, e.Version, why)
					if instead == nil || isKnown && (d == instead.Wire || d.Version == instead.Version) {
						withheld = true
						return // the client keeps what it has
					}
					e = instead
				}
			}
			if !fits(name, e.wireSize()) {
				return
			}
			resources = append(resources, e.Wire)
			if ks.forced[name] {
				sentForced = append(sentForced, name)
			}
		default:
			ks.unhold(name)
			if isKnown {
				if wh != nil {
					if why := wh.Keep(cv, w.kind, name); why != "" {
						ks.keep(name, why)
						return // the client keeps it
					}
					delete(ks.kept, name)
				}
				if !fits(name, len(name)+WireOverhead) {
					return
				}
				removed = append(removed, name)
			}
			delete(ks.forced, name) // no longer served: nothing to resend
		}
	}
	switch {
	case all:
		resources = order.wires
	case ks.full:
		for _, e := range order.entries { // in name order: so is the response
			look(e.Name, e)
		}
		ks.delivered.each(func(n string, _ *discovery.Resource) {
			if _, ok := entries[n]; !ok {
				look(n, nil)
			}
		})
	default:
		for n := range ks.dirty {
			look(n, entries[n])
		}
		for _, n := range names {
			look(n, entries[n])
		}
		slices.SortFunc(resources, byName)
	}
	ks.full = false
	clear(ks.dirty)
	for _, n := range rest {
		ks.markDirty(n)
	}
	if len(resources)+len(removed) == 0 && (!st.sotw || !ks.sotwWhole || withheld) {
		return // nothing to send (an empty SotW response would drop what is held back)
	}
	slices.Sort(removed)
	if st.sotw {
		if !c.answerSotwLocked(st, ks, w, snap, resources, removed, all) {
			return
		}
	} else {
		var resp *discovery.DeltaDiscoveryResponse
		if sh := c.shared(snap, w.kind); sh != nil && st.info.loop && sh.is(resources, removed) && !st.carries(&sh.resp) {
			resp = &sh.resp // every stream's answer, as it is
		} else {
			resp = &discovery.DeltaDiscoveryResponse{TypeUrl: w.kind, SystemVersionInfo: c.versionInfo(),
				Resources: resources, RemovedResources: removed}
		}
		w.answered = true
		w.answer.pass = cache.DeltaPassthroughResponse{DeltaRequest: w.req, DeltaDiscoveryResponse: resp}
		w.resp = &w.answer.pass
	}
	w.forced = sentForced
	st.queue = append(st.queue, w)
	if !st.deferWake {
		st.signal()
	}
}
