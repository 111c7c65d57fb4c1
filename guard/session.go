package guard

// One client stream's session: what the wrapped cache serves of each type, what the client
// holds (what it ACKed, what it refused), the responses in flight, the retry state, and the
// goroutine that talks to the wrapped cache and the server.
//
// Invariants (under mu):
//   - acked.get(name) is the version the client last accepted of name, with its content (what the
//     client keeps while a newer version is refused or withheld).
//   - A response is made only for an open watch (w), at most one per watch, and only when what
//     the client should see (view) differs from what it was last sent, or a name is forced.
//   - Nothing is sent on a channel under mu: responses wait in outq for the session's goroutine.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/nack"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/internal/serial"
)

type session struct {
	g     *Guard
	id    int64 // the guard's: the server's stream id, negated for a delta stream
	delta bool  // a delta stream: responses are what changed since the last one

	// The work queue the retry scheduler steps the stream's retry state through.
	serial.Queue
	retry retry.Stream

	mu      sync.Mutex // guards the fields below but bound (Guard.mu's)
	node    string
	opened  bool // the scheduler was told of the stream
	review  bool // what the client holds changed: every type is evaluated again (reviewIfAsked)
	types   map[string]*typeState
	outq    []queued
	bound   map[string]any // under Guard.mu: the last request of each type bound for CreateWatch or CreateDeltaWatch
	insight map[string]*TypeInsight

	owner ownerState // ownercheck.go
	held  uint64     // how many times what the client holds changed (an ACK, a NACK)

	// What the bounds counted (bounds.go): the types and names asked for, and the node whose
	// streams the stream counts among.
	asked     map[string]askedType
	counted   bool
	countedAs string

	ctx      context.Context // canceled when the stream closes: the owner checks in flight
	cancel   context.CancelFunc
	wg       sync.WaitGroup      // the owner checks in flight
	innerOut chan cache.Response // every watch of the wrapped cache answers here (nil with feeds)
	wake     chan struct{}
	stop     chan struct{}
	done     chan struct{}
}

// typeState is what a session knows of one type.
type typeState struct {
	typeURL string

	// The wrapped cache's side: every resource of the type, from the stream's own watch of it, or
	// from the feed every stream of the type shares (Options.NodeIndependent).
	innerCancel func()
	innerFirst  *discovery.DiscoveryRequest // the client's first request, until the first watch of the wrapped cache is made
	feed        *feed
	served      *served // nil until the wrapped cache answers

	// The server's side.
	w   *watch             // the open watch, nil once answered
	sub cache.Subscription // what the client asked for last

	// The client's side.
	acked    holding
	refused  map[string]refusal
	forced   map[string]bool
	flight   []*flight // responses made and not answered, oldest first
	lastView []*item   // SotW: the view the last response was made from, sorted by name
	lastSub  string    // SotW: the names the client asked for then ("*": every one), sorted
	seq      uint64
	// evaluated is the count of changes to what the client holds (session.held) when the
	// type's view was last made for an open watch: a review after an ACK skips a type whose
	// view was made since (the new watch that came with the ACK).
	evaluated uint64
	// sentView (delta) is what the client was sent and keeps, by name: a response carries what
	// differs from it. A refused name goes back to what the client kept.
	sentView holding
	seeded   bool              // delta: sentView was seeded with what the client said it holds
	warm     map[string]warmed // route configurations made to warm clusters up, by name
}

// warmed is a route configuration the client holds, with routes added that make it ask for
// clusters (warmLocked).
type warmed struct {
	from     *item
	clusters string
	it       *item
}

// refusal is a version the client refused, and why.
type refusal struct {
	version, reason string
}

// watch is the server's watch of one type: SotW (req, out) or delta (deltaReq, deltaOut).
type watch struct {
	req      *discovery.DiscoveryRequest
	out      chan cache.Response
	deltaReq *discovery.DeltaDiscoveryRequest
	deltaOut chan cache.DeltaResponse
	sub      cache.Subscription
	canceled chan struct{}
}

// flight is one response made for the client and not answered yet.
type flight struct {
	resp    *discovery.DiscoveryResponse      // SotW
	delta   *discovery.DeltaDiscoveryResponse // delta
	items   []*item
	whole   *served          // the shared served whose every item items are (its own slice), if any
	removed []string         // delta: the names it removes
	undo    map[string]*item // delta: what sentView had of its names before it (a name it had not: none)
	nonce   string           // set when the server sends it
}

type queued struct {
	w     *watch
	ts    *typeState
	f     *flight
	resp  cache.Response
	delta cache.DeltaResponse
}

// Bounds of what one client stream may cost the guard.
const (
	// maxFlight bounds the unanswered responses a session remembers per type.
	maxFlight = 16
	// maxLastError bounds the part of a NACK's message kept for the insight (nack.Read reads
	// 64 KiB of it at most).
	maxLastError = 4 << 10
)

func newSession(g *Guard, id int64, delta bool) *session {
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{g: g, id: id, delta: delta, ctx: ctx, cancel: cancel, types: map[string]*typeState{}, bound: map[string]any{},
		insight: map[string]*TypeInsight{}, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if !g.nodeIndependent {
		// The stream's own watches of the wrapped cache answer here, room for two answers of
		// each type it may ask for (Options.MaxTypesPerStream), so that the cache's synchronous
		// answers never block; feeds (a kilobyte a stream saved) answer through wake.
		s.innerOut = make(chan cache.Response, 2*g.bounds.types)
	}
	return s
}

func (s *session) typeOf(typeURL string) *typeState {
	ts := s.types[typeURL]
	if ts == nil {
		ts = &typeState{typeURL: typeURL,
			refused: map[string]refusal{}, forced: map[string]bool{}, warm: map[string]warmed{}}
		s.types[typeURL] = ts
		s.insight[typeURL] = &TypeInsight{TypeURL: typeURL}
	}
	return ts
}

// Retry is the stream's retry state (retry.Session).
func (s *session) Retry() *retry.Stream { return &s.retry }

// Resend makes the named resources (type URL -> names) be sent again although the client
// refused their version (retry.Session): a retry round.
func (s *session) Resend(names map[string][]string) {
	s.mu.Lock()
	for typeURL, ns := range names {
		ts := s.types[typeURL]
		if ts == nil {
			continue
		}
		for _, n := range ns {
			ts.forced[n] = true
		}
		s.insight[typeURL].Resent += int64(len(ns))
		s.evaluateLocked(ts)
	}
	s.mu.Unlock()
	s.poke()
}

func (s *session) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run is the session's goroutine: it takes the wrapped cache's answers and hands the responses
// made to the server, in order, until the stream closes.
func (s *session) run() {
	defer close(s.done)
	for {
		select {
		case r := <-s.innerOut:
			s.fromInner(r)
		case <-s.wake:
			s.watchFirst()
			s.fromFeeds()
			s.reviewIfAsked()
		case <-s.stop:
			return
		}
		for {
			s.mu.Lock()
			if len(s.outq) == 0 {
				s.mu.Unlock()
				break
			}
			q := s.outq[0]
			s.outq = s.outq[1:]
			s.mu.Unlock()
			if q.delta != nil {
				select {
				case q.w.deltaOut <- q.delta:
				case <-q.w.canceled:
					s.undo(q) // the server moved on: the next watch gets what this one did not
				case <-s.stop:
					return
				}
				continue
			}
			select {
			case q.w.out <- q.resp:
			case <-q.w.canceled:
				s.undo(q) // the server moved on: the next watch gets what this one did not
			case <-s.stop:
				return
			}
		}
	}
}

// undo undoes a response the server's watch was canceled before taking, and answers the type's
// next watch, if there is one already.
func (s *session) undo(q queued) {
	s.mu.Lock()
	s.undoLocked(q.ts, q.f)
	s.evaluateLocked(q.ts)
	s.mu.Unlock()
}

// closing reports whether close has begun: what it has not stopped by now, it will not stop.
func (s *session) closing() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// close stops the session's goroutine and its watches of the wrapped cache.
func (s *session) close() {
	s.retry.Close()
	s.cancel()
	close(s.stop)
	<-s.done
	s.wg.Wait()
	s.mu.Lock()
	var cancels []func()
	var feeds []*feed
	for _, ts := range s.types {
		if ts.innerCancel != nil {
			cancels = append(cancels, ts.innerCancel)
			ts.innerCancel = nil
		}
		if ts.feed != nil {
			feeds = append(feeds, ts.feed)
		}
	}
	s.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	for _, f := range feeds {
		s.g.unsubscribe(s, f)
	}
}

// watchFirst makes the first watch of the wrapped cache of each type a client asked for. Only
// the session's goroutine watches the wrapped cache (here and in fromInner), so a type has one
// watch at a time, whatever order its answers come in.
func (s *session) watchFirst() {
	s.mu.Lock()
	var first []*discovery.DiscoveryRequest
	for _, ts := range s.types {
		if ts.innerFirst != nil {
			first = append(first, ts.innerFirst)
			ts.innerFirst = nil
		}
	}
	s.mu.Unlock()
	for _, req := range first {
		s.watchInner(req.GetTypeUrl(), req, "", nil)
	}
}

// fromInner takes the wrapped cache's answer for a type, to the stream's own watch: every
// resource it serves now. It watches again for the next version, and answers the client's watch
// if its view changed.
func (s *session) fromInner(r cache.Response) {
	resp, answered, err := s.g.answer(r)
	if err != nil {
		s.g.log.Error("the wrapped cache's response cannot be encoded", "error", err)
		return
	}
	typeURL, req := r.GetRequest().GetTypeUrl(), r.GetRequest()
	s.mu.Lock()
	ts := s.typeOf(typeURL)
	ts.served = ts.served.fold(typeURL, answered, resp.GetVersionInfo(), r.GetReturnedResources(), true)
	old := ts.innerCancel
	s.mu.Unlock()
	if old != nil {
		old()
	}
	s.watchInner(typeURL, req, resp.GetVersionInfo(), r.GetReturnedResources())
	s.mu.Lock()
	s.evaluateLocked(ts)
	s.mu.Unlock()
}

// fromFeeds takes, for each type served from a feed, what it serves now, and answers the
// client's watch if its view changed.
func (s *session) fromFeeds() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ts := range s.types {
		if ts.feed == nil {
			continue
		}
		if cur := ts.feed.cur.Load(); cur != ts.served {
			ts.served = cur
			s.evaluateLocked(ts)
		}
	}
}

// rawResources are the resources of a RawResponse, in the order of its encoded ones (n of
// them), so that each is named and read without decoding it, whatever its type URL (a cache may
// serve a message under a type URL of its own: kds-host's kinds, Kuma's). Nil for another
// response, or one with a TTL (encoded in a wrapper).
func rawResources(r cache.Response, n int) []types.ResourceWithTTL {
	rr, ok := r.(*cache.RawResponse)
	if !ok || rr.Heartbeat {
		return nil
	}
	raw := rr.GetRawResources()
	if len(raw) != n {
		return nil
	}
	for _, x := range raw {
		if x.TTL != nil || x.Resource == nil {
			return nil
		}
	}
	return raw
}

// watchInner opens the guard's watch of the wrapped cache for every resource of a type newer
// than version.
func (s *session) watchInner(typeURL string, like *discovery.DiscoveryRequest, version string, returned map[string]string) {
	req, sub := wildcard(like, version, returned)
	cancel, err := s.g.inner.CreateWatch(req, sub, s.innerOut)
	if err != nil {
		s.g.log.Error("the wrapped cache refused a watch", "type", typeURL, "error", err)
		return
	}
	s.mu.Lock()
	if s.closing() {
		s.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		return
	}
	s.types[typeURL].innerCancel = cancel
	s.mu.Unlock()
}

// watch is the server's watch for a type: the client's request, answered when there is
// something new for it.
func (s *session) watch(w *watch, typeURL string, node *core.Node) (func(), error) {
	w.canceled = make(chan struct{})
	s.mu.Lock()
	ts := s.typeOf(typeURL) // a type the request callbacks admitted (bounds.go)
	ts.w, ts.sub = w, w.sub
	switch {
	case s.g.nodeIndependent:
		if ts.feed == nil && !s.closing() {
			ts.feed = s.g.subscribe(s, typeURL, node)
			ts.served = ts.feed.cur.Load() // and a poke for each answer from now on
		}
		s.evaluateLocked(ts)
	case ts.innerCancel == nil && ts.served == nil:
		// The session's goroutine makes the first watch of the wrapped cache.
		ts.innerFirst = &discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL}
	default:
		s.evaluateLocked(ts)
	}
	s.mu.Unlock()
	s.poke()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(w.canceled)
			s.mu.Lock()
			if ts.w == w {
				ts.w = nil
			}
			s.unsentLocked(ts, w)
			s.mu.Unlock()
		})
	}, nil
}

// evaluateLocked answers the type's open watch when what the client should see differs from
// what it was last sent. Call with s.mu.
func (s *session) evaluateLocked(ts *typeState) {
	w := ts.w
	if w == nil || ts.served == nil {
		return
	}
	defer s.checkOwnersLocked() // what the view found without an owner verdict
	ts.evaluated = s.held
	buf := views.Get().(*[]*item)
	defer views.Put(buf)
	items, forced := s.viewLocked(ts, (*buf)[:0])
	*buf = items[:0] // what it grew to, for the next view
	if ts.seq == 0 && slices.ContainsFunc(s.insight[ts.typeURL].Withheld, func(w Withheld) bool { return w.Reason == ownerPending }) {
		return // the type's first response waits for the first owner check
	}
	if s.delta {
		s.respondDeltaLocked(ts, w, items)
		return
	}
	// An item is one version of one name (the item cache hands out one per content), so the
	// same items are the same view.
	if slices.Equal(items, ts.lastView) && !forced && ts.seq > 0 {
		return // nothing new: the watch stays open
	}
	view := ts.served.sorted // everything a shared served holds: its own slice, which never changes
	if !ts.served.holdsAll(items) {
		view = slices.Clone(items) // items is the buffer's
	}
	items = view
	// A type whose SotW response is not the client's whole state (all but Listeners and
	// Clusters) gets what changed, as go-control-plane's caches send it: the names whose version
	// the client has not accepted, and those a retry round forces. Its first response, and the
	// first after the client asked for other names, carry the whole view.
	var sub string
	partial := false
	if !fullState(ts.typeURL) {
		sub = subscriptionKey(w.sub)
		partial = ts.seq > 0 && sub == ts.lastSub
	}
	if partial {
		changed := make([]*item, 0, 1)
		for _, it := range items {
			if a := ts.acked.get(it.name); a == nil || a.version != it.version || ts.forced[it.name] {
				changed = append(changed, it)
			}
		}
		items = changed
	}
	for _, it := range items {
		delete(ts.forced, it.name)
	}
	ts.lastView, ts.lastSub = view, sub
	if partial && len(items) == 0 {
		return // the view lost a name, which such a response cannot say: the watch stays open
	}
	ts.seq++
	resp := &discovery.DiscoveryResponse{VersionInfo: fmt.Sprintf("%s.%d", ts.served.version, ts.seq), TypeUrl: ts.typeURL}
	f := &flight{resp: resp, items: items}
	if ts.served.whole(items) {
		resp.Resources, f.whole = ts.served.anys, ts.served // shared by every stream's response of them
	} else {
		resp.Resources = make([]*anypb.Any, len(items))
		for i, it := range items {
			resp.Resources[i] = it.any
		}
	}
	s.addFlightLocked(ts, f)
	ts.w = nil
	s.outq = append(s.outq, queued{w: w, ts: ts, f: f, resp: &response{req: w.req, resp: resp}})
}

// subscriptionKey names what a SotW client asks for: "*" for every resource of the type, else
// its names, sorted.
func subscriptionKey(sub cache.Subscription) string {
	if sub.IsWildcard() {
		return "*"
	}
	names := make([]string, 0, len(sub.SubscribedResources()))
	for n := range sub.SubscribedResources() {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

func (s *session) addFlightLocked(ts *typeState, f *flight) {
	ts.flight = append(ts.flight, f)
	if len(ts.flight) > maxFlight {
		ts.flight = ts.flight[1:]
	}
}

// viewLocked is what the client should hold of the type now, by name (sorted), appended to
// into, and whether a name in it is forced (a retry round sends it although nothing changed).
// Call with s.mu.
func (s *session) viewLocked(ts *typeState, into []*item) (items []*item, forced bool) {
	w := ts.w
	var view []*item // what the cache serves that the client asks for, sorted by name
	if w.sub.IsWildcard() {
		view = slices.Clip(ts.served.sorted) // an append below copies it
	} else {
		for n := range w.sub.SubscribedResources() {
			if it := ts.served.get(n); it != nil {
				view = append(view, it)
			}
		}
		slices.SortFunc(view, byItemName)
	}
	items, forced, held := s.pickLocked(ts, view, nil, into)
	// Names the client holds and the cache no longer serves are removed, but not while something
	// else the client holds references them (break after make: an old route's cluster stays
	// until the client has the route that no longer names it), nor, but for a Listener (what
	// nothing references), while the client still asks for them by name: grpc-go asks for a
	// cluster until its last RPC on it is done, though its route no longer names it. There are
	// such names only when the client holds more than the view's names.
	if held == ts.acked.len() || s.g.opts.NoHolds {
		return items, forced
	}
	var kept map[string]string
	for n, a := range ts.acked.all() {
		if ts.served.get(n) != nil || !s.subscribedLocked(ts, n) {
			continue
		}
		why := ""
		if by := s.referencedByLocked(ts.typeURL, n); by != "" {
			why = "removed, kept while the client holds " + by + ", which references it"
		} else if !ts.sub.IsWildcard() && ts.typeURL != resource.ListenerType {
			why = "removed, kept while the client asks for it"
		} else {
			continue
		}
		if kept == nil {
			kept = map[string]string{}
		}
		kept[n] = why
		view = append(view, a)
	}
	if kept == nil {
		return items, forced
	}
	slices.SortFunc(view, byItemName)
	items, forced, _ = s.pickLocked(ts, view, kept, into)
	return items, forced
}

// pickLocked is what the client should hold of each of view's items, appended to into: the
// item, what it holds instead (a version held back, or kept: a name no longer served, with why),
// or nothing. It reports whether one is forced, and how many of view's names the client holds.
// It notes what it holds back in the type's insight. Call with s.mu.
func (s *session) pickLocked(ts *typeState, view []*item, kept map[string]string, into []*item) (items []*item, forced bool, held int) {
	ins := s.insight[ts.typeURL]
	ins.Withheld = ins.Withheld[:0]
	items = slices.Grow(into[:0], len(view))
	for _, it := range view {
		n := it.name
		a := ts.acked.get(n)
		if a != nil {
			held++
		}
		if why, ok := kept[n]; ok {
			ins.Withheld = append(ins.Withheld, Withheld{Name: n, Reason: why}) // it is what the client holds
		} else if a != nil && a.version == it.version {
			// The client has this very version: nothing to hold back.
		} else if why, warm := s.withholdLocked(ts, it); why != "" {
			ins.Withheld = append(ins.Withheld, Withheld{Name: n, Version: it.version, Reason: why})
			it = a // the client keeps what it has, if anything
			if it == nil {
				continue
			}
			if len(warm) > 0 {
				it = s.warmLocked(ts, it, warm)
			}
		} else if ts.forced[n] {
			forced = true
		}
		items = append(items, it)
	}
	return items, forced, held
}

// views are the buffers views are made in: a view is copied only when it differs from the one
// last sent, which it seldom does (each ACK's new watch and each review make one).
var views = sync.Pool{New: func() any { return new([]*item) }}

func byItemName(a, b *item) int { return strings.Compare(a.name, b.name) }

func itemNamed(it *item, name string) int { return strings.Compare(it.name, name) }

// withholdLocked says why the client should not get it now, or "". warm are the clusters a
// route configuration waits for that the client does not ask for yet: a client that asks for
// clusters by name, once a route names them (grpc-go), is made to ask for them with the route
// configuration it holds (warmLocked), so that it can accept them before the new version of the
// route sends traffic to them (make-before-break).
func (s *session) withholdLocked(ts *typeState, it *item) (why string, warm []string) {
	if r, ok := ts.refused[it.name]; ok && r.version == it.version && !ts.forced[it.name] {
		return "refused by the client: " + r.reason, nil
	}
	if s.g.opts.NoHolds {
		return s.ownerWithholdLocked(ts, it), nil
	}
	var waiting []string
	for _, ref := range it.refs {
		rts := s.types[ref.TypeURL]
		if rts != nil {
			if a := rts.acked.get(ref.Name); a != nil {
				// A route's cluster: and what the cluster references in turn (its endpoints),
				// when served.
				if ts.typeURL == resource.RouteType {
					if w := s.pendingRefsLocked(a); w != "" {
						waiting = append(waiting, w)
					}
				}
				continue
			}
		}
		what := fmt.Sprintf("%s %q", shortType(ref.TypeURL), ref.Name)
		if rts != nil {
			if r, ok := rts.refused[ref.Name]; ok {
				what += " (it refused it: " + r.reason + ")"
			}
		}
		switch {
		case rts != nil && s.subscribedLocked(rts, ref.Name):
			waiting = append(waiting, what)
		case rts != nil && ts.typeURL == resource.RouteType && ref.TypeURL == resource.ClusterType && ts.acked.get(it.name) != nil:
			waiting = append(waiting, what)
			warm = append(warm, ref.Name)
		default:
			// The client does not ask for it, and nothing it holds can make it: not waited for.
		}
	}
	if len(waiting) == 0 {
		return s.ownerWithholdLocked(ts, it), nil
	}
	return "waiting for the client to accept " + strings.Join(waiting, ", "), warm
}

// referencedByLocked names a resource the client holds that references name of typeURL, or "".
// Call with s.mu.
func (s *session) referencedByLocked(typeURL, name string) string {
	want := Ref{TypeURL: typeURL, Name: name}
	for _, ts := range s.types {
		for _, a := range ts.acked.all() {
			if slices.Contains(a.refs, want) {
				return fmt.Sprintf("%s %q", shortType(ts.typeURL), a.name)
			}
		}
	}
	return ""
}

// pendingRefsLocked names what a (accepted) resource references that the server serves and the
// client has not accepted yet, or "". The client asks for those once it has the resource (a
// cluster's endpoints), so it is waited for whether or not it asked yet. Call with s.mu.
func (s *session) pendingRefsLocked(a *item) string {
	var out []string
	for _, ref := range a.refs {
		rts := s.types[ref.TypeURL]
		if rts == nil {
			continue // the client has not asked for any of the type: nothing to know
		}
		if rts.acked.get(ref.Name) != nil {
			continue
		}
		if rts.served.get(ref.Name) != nil {
			out = append(out, fmt.Sprintf("%s %q", shortType(ref.TypeURL), ref.Name))
		}
	}
	return strings.Join(out, ", ")
}

// subscribedLocked reports whether the client asks for name of the type.
func (s *session) subscribedLocked(ts *typeState, name string) bool {
	if ts.sub == nil {
		return false
	}
	if ts.sub.IsWildcard() {
		return true
	}
	_, ok := ts.sub.SubscribedResources()[name]
	return ok
}

func shortType(typeURL string) string {
	if i := strings.LastIndexByte(typeURL, '.'); i >= 0 {
		return typeURL[i+1:]
	}
	return typeURL
}

// sent records that the server sends resp (with its nonce), and tells the retry scheduler what
// it brings new.
func (s *session) sent(typeURL, nonce string, is func(*flight) bool) {
	s.mu.Lock()
	ts := s.types[typeURL]
	var f *flight
	if ts != nil {
		for _, x := range ts.flight {
			if is(x) {
				f = x
			}
		}
	}
	if f == nil {
		s.mu.Unlock()
		return
	}
	f.nonce = nonce
	ins := s.insight[ts.typeURL]
	ins.Responses++
	s.g.totals.add(&s.g.totals.responses, ts.typeURL)
	fresh := newVersions(ts, f.items)
	zone, opened := s.node, s.opened
	s.mu.Unlock()
	if opened {
		s.g.obs.Sent(event.Sent{StreamID: s.id, Node: zone, TypeURL: ts.typeURL, Versions: fresh.versions()})
	}
}

// freshItems are items at a version the client has not accepted, sorted by name.
type freshItems []*item

// newVersions are the items at a version the client has not accepted.
func newVersions(ts *typeState, items []*item) freshItems {
	var fresh freshItems // nil while every item so far is new: then it is items itself
	for i, it := range items {
		if a := ts.acked.get(it.name); a == nil || a.version != it.version {
			if fresh != nil {
				fresh = append(fresh, it)
			}
		} else if fresh == nil {
			fresh = append(make(freshItems, 0, len(items)-1), items[:i]...)
		}
	}
	if fresh == nil {
		fresh = items // read only, as a flight's items are
	}
	if !slices.IsSortedFunc(fresh, byItemName) { // a view's are
		fresh = slices.Clone(fresh)
		slices.SortFunc(fresh, byItemName)
	}
	return fresh
}

// get is the version of name, if it is one of them.
func (f freshItems) get(name string) (string, bool) {
	if i, ok := slices.BinarySearchFunc(f, name, itemNamed); ok {
		return f[i].version, true
	}
	return "", false
}

// versions is the view of them that events carry.
func (f freshItems) versions() event.Versions {
	return event.VersionsFunc(len(f), func(yield func(string, string) bool) {
		for _, it := range f {
			if !yield(it.name, it.version) {
				return
			}
		}
	}, f.get)
}

// request applies what a client's request says of the last response of its type: an ACK, or a
// NACK and what it refused.
func (s *session) request(node *core.Node, typeURL, nonce string, detail *rpcstatus.Status) {
	s.mu.Lock()
	if s.node == "" {
		s.node = node.GetId()
	}
	open := !s.opened
	s.opened = true
	zone := s.node
	var ack *event.ACK
	var nack *event.NACK
	if ts := s.types[typeURL]; ts != nil && nonce != "" {
		for i, f := range ts.flight {
			if f.nonce != nonce {
				continue
			}
			ts.flight = ts.flight[i+1:]
			ack, nack = s.answerLocked(ts, f, detail)
			break
		}
	}
	s.mu.Unlock()
	if open {
		s.g.obs.StreamOpened(s.id, zone)
	}
	if ack != nil {
		s.g.obs.ACK(*ack)
	}
	if nack != nil {
		s.g.obs.NACK(*nack)
		s.g.log.Debug("client refused resources", "client", zone, "type", nack.TypeURL, "refused", len(nack.Rejected), "detail", nack.Detail)
	}
	if ack != nil || nack != nil {
		// What the client holds changed: what waited for it may go now. The session's
		// goroutine looks, not the xDS callback.
		s.mu.Lock()
		s.review = true
		s.mu.Unlock()
		s.poke()
	}
}

// reviewIfAsked evaluates every type again when what the client holds changed (review).
func (s *session) reviewIfAsked() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.review {
		return
	}
	s.review = false
	for _, ts := range s.types {
		if ts.evaluated != s.held { // else its view was made since, with what the client holds now
			s.evaluateLocked(ts)
		}
	}
}

// answerLocked applies the client's answer to response f, and returns the event for the retry
// scheduler. Call with s.mu.
func (s *session) answerLocked(ts *typeState, f *flight, detail *rpcstatus.Status) (*event.ACK, *event.NACK) {
	ins := s.insight[ts.typeURL]
	fresh := newVersions(ts, f.items)
	if detail == nil {
		ins.ACKs++
		ins.LastError = ""
		s.acceptLocked(ts, f.items, nil, f.whole)
		for _, n := range f.removed {
			ts.acked.set(n, nil)
		}
		ts.acked.settle(ts.served)
		s.ownerArrivedLocked()
		return &event.ACK{StreamID: s.id, Node: s.node, TypeURL: ts.typeURL, Versions: fresh.versions(), Removed: f.removed}, nil
	}
	ins.NACKs++
	s.g.totals.add(&s.g.totals.nacks, ts.typeURL)
	carried := make([]nack.Carried, len(f.items))
	for i, it := range f.items {
		_, isNew := fresh.get(it.name)
		carried[i] = nack.Carried{Name: it.name, Version: it.version, New: isNew}
	}
	// A plain client's NACK is about content (neither Envoy nor grpc-go has a transient cause).
	rejected, msg := nack.Read(detail, carried, maxLastError, event.CauseInvalid)
	ins.LastError = msg
	nk := &event.NACK{StreamID: s.id, Node: s.node, TypeURL: ts.typeURL, Detail: msg, Accepted: map[string]string{}, Rejected: rejected}
	isRefused := make(map[string]bool, len(rejected))
	refused := make([]string, 0, len(rejected))
	for _, rj := range rejected {
		isRefused[rj.Name] = true
		refused = append(refused, rj.Name)
		ts.refused[rj.Name] = refusal{version: rj.Version, reason: rj.Reason}
	}
	var accepted []*item
	for _, it := range f.items {
		if isRefused[it.name] {
			continue
		}
		accepted = append(accepted, it)
		if v, ok := fresh.get(it.name); ok {
			nk.Accepted[it.name] = v
		}
	}
	// grpc-go and Envoy take the valid resources of a response they NACK.
	s.acceptLocked(ts, accepted, refused, nil)
	s.ownerArrivedLocked()
	if s.delta {
		for _, n := range refused {
			s.keptLocked(ts, n) // the client keeps what it had: the next response is made against that
		}
		for _, n := range f.removed {
			if !isRefused[n] {
				ts.acked.set(n, nil)
			}
		}
	}
	ts.acked.settle(ts.served)
	return nil, nk
}

// acceptLocked records that the client holds items now, whole if they are everything a shared
// served holds. Of a type whose response is the client's whole state (fullState), it holds
// nothing else, but for the names it refused in the same answer (kept: it keeps the version it
// had). Call with s.mu.
func (s *session) acceptLocked(ts *typeState, items []*item, kept []string, whole *served) {
	full := s.fullStateLocked(ts.typeURL)
	switch {
	case whole != nil && len(kept) == 0 && (full || ts.acked.holdsWithin(whole)):
		ts.acked.holdServed(whole) // everything whole holds, and nothing else
	default:
		if full {
			was := ts.acked
			ts.acked.own(len(items) + len(kept))
			for _, n := range kept {
				if it := was.get(n); it != nil {
					ts.acked.set(n, it)
				}
			}
		} else if ts.acked.len() == 0 {
			ts.acked.own(len(items)) // the first answer: grown once, not by doubling
		}
		for _, it := range items {
			ts.acked.set(it.name, it)
		}
	}
	for _, it := range items {
		if r, ok := ts.refused[it.name]; ok && r.version == it.version {
			delete(ts.refused, it.name)
		}
	}
}

// fullState reports whether a SotW response of the type is the client's whole state of it
// (Listeners, Clusters): a name left out is removed.
func (s *session) fullStateLocked(typeURL string) bool {
	return !s.delta && fullState(typeURL)
}

func fullState(typeURL string) bool {
	return typeURL == resource.ListenerType || typeURL == resource.ClusterType
}

// response is a response the guard made: the server sends it as is.
type response struct {
	req  *discovery.DiscoveryRequest
	resp *discovery.DiscoveryResponse
}

func (r *response) GetDiscoveryResponse() (*discovery.DiscoveryResponse, error) { return r.resp, nil }
func (r *response) GetRequest() *discovery.DiscoveryRequest                     { return r.req }
func (r *response) GetVersion() (string, error)                                 { return r.resp.GetVersionInfo(), nil }
func (r *response) GetResponseVersion() string                                  { return r.resp.GetVersionInfo() }
func (r *response) GetReturnedResources() map[string]string                     { return nil }
func (r *response) GetContext() context.Context                                 { return context.Background() }
