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
//   - A type's view made (made) is what a full view would be now but for its names in dirty:
//     whatever changes what the client should see of a name marks it (review.go).

import (
	"context"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/internal/serial"
	"github.com/kds-host/kds-host/internal/shrink"
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
	review  bool // what the client holds changed: each type with names marked is evaluated again (reviewIfAsked)
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
	// What changed since the view was last made for a watch (review.go): made says lastView
	// (SotW) or sentView (delta) is the view made from madeServed and the subscription then,
	// but for the names in dirty; waiting are the names of that view whose pick depends on more
	// than their own version (not held at the version served, or a removal kept); asked says
	// a delta request changed what the client asks for since.
	made        bool
	madeServed  *served
	dirty       map[string]struct{}
	waiting     map[string]struct{}
	waitingPeak shrink.Peak
	asked       bool
	// sentView (delta) is what the client was sent and keeps, by name: a response carries what
	// differs from it. A refused name goes back to what the client kept.
	sentView holding
	seeded   bool              // delta: sentView was seeded with what the client said it holds
	warm     map[string]warmed // route configurations made to warm clusters up, by name

	verdicts     map[string]ownerVerdict // the owner check's, of names in the view (ownercheck.go)
	verdictsPeak shrink.Peak
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
			markLocked(ts, n)
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
	s.owner.waits = nil
	for _, ts := range s.types {
		ts.verdicts = nil // the stream's verdicts go with it
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
	s.serveLocked(ts, ts.served.fold(typeURL, answered, resp.GetVersionInfo(), r.GetReturnedResources(), true))
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
			s.serveLocked(ts, cur)
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
	changed := s.subChangedLocked(ts, w.sub)
	ts.w, ts.sub, ts.asked = w, w.sub, false
	if changed {
		// Its view is made again, what waits on a name of it looks again, and the verdicts of
		// names no longer asked for go.
		ts.made = false
		s.waitersChangedLocked(ts)
		s.goneVerdictsLocked(ts)
	}
	switch {
	case s.g.nodeIndependent:
		if ts.feed == nil && !s.closing() {
			ts.feed = s.g.subscribe(s, typeURL, node)
			s.serveLocked(ts, ts.feed.cur.Load()) // and a poke for each answer from now on
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
