package engine

// The delta stream loop: go-control-plane's delta server loop (pkg/server/delta/v3, v0.14)
// reduced to what the engine needs. It sends the session's answered responses itself, in order,
// when the budget has room: on the RPC's goroutine, a write's fan-out (sendNow), or a goroutine
// started for it (kick, awaitRoom). Callbacks are called in that loop's order, one at a time.

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// deltaStream is one stream's state in the loop.
type deltaStream struct {
	id      int64
	str     discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	cache   *Cache
	tracker *Tracker
	st      *Session
	close   context.CancelCauseFunc // ends the stream with a status: its Recv and Send return

	kicked   atomic.Bool // a send of the session's queue is due (started, or after handling)
	handling atomic.Bool // the RPC's goroutine is handling a request

	mu      sync.Mutex // guards the fields below; never held across Send, an observer, or a wait
	idle    sync.Cond  // on mu: draining ended
	closed  bool       // the loop has ended: nothing is sent any more
	failed  error      // a send failed: the stream ends with it
	nonce   int64
	watches map[string]*deltaWatch

	// pending is the watch taken off the session's queue whose response (cost bytes) waits for
	// room in the budget (wait; awaitRoom waits for it).
	pending *watch
	cost    int64
	wait    *budgetWaiter

	outbox   []outgoing // handed over and numbered, not sent yet
	head     int        // outbox[:head] is sent
	unsent   int64      // the cost of outbox[head:]
	draining bool       // a goroutine is sending the outbox (flush)
}

// outgoing is a response handed over to be sent, with its record in the session.
type outgoing struct {
	resp   *discovery.DeltaDiscoveryResponse
	flight *inflight
	cost   int64
}

type deltaWatch struct {
	w   *watch // the open watch, closed by cancel
	sub stream.Subscription
}

func (s *deltaStream) cancel(dw *deltaWatch) { s.cache.cancel(s.st, dw.w) }

// serveDelta serves one delta stream until the RPC ends, the client stops sending, its
// streamInfo's close ends it, or a request or a send fails.
func serveDelta(ctx context.Context, id int64, str discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer, c *Cache, t *Tracker) error {
	s := &deltaStream{id: id, str: str, cache: c, tracker: t, close: streamInfoOf(ctx).close, watches: map[string]*deltaWatch{}}
	s.idle.L = &s.mu
	node := &core.Node{}
	defer func() {
		s.mu.Lock() // the stream has ended: a send at work returns
		s.closed = true
		s.abandon() // before the watches: canceling the pending one waits for it
		for _, w := range s.watches {
			s.cancel(w)
		}
		for s.draining {
			s.idle.Wait()
		}
		s.mu.Unlock()
		t.OnDeltaStreamClosed(id, node)
	}()
	if err := t.OnDeltaStreamOpen(ctx, id, ""); err != nil {
		return err
	}
	if s.st = c.Session(id); s.st == nil {
		return status.Error(codes.Unavailable, "the stream's session is closed")
	}
	s.st.mu.Lock()
	s.st.sendNow, s.st.kick = s.sendNow, s.kick
	s.st.mu.Unlock()
	for {
		req, err := str.Recv()
		if err != nil {
			// The stream ends first, so that no send waits for the client.
			s.mu.Lock()
			failed := s.failed
			s.mu.Unlock()
			if failed == nil {
				failed = t.refused(s.st, err)
			}
			s.close(failed)
			return failed
		}
		s.handling.Store(true)
		err = s.request(req, &node)
		s.handling.Store(false)
		sent := s.flush(sendNowLimit)
		if err != nil {
			s.close(err) // the client is told, and a send of another goroutine's ends
			return err
		}
		if s.kicked.Load() || !sent { // kicked meanwhile, or more to send
			s.kicked.Store(true)
			go s.pumpKicked()
		}
	}
}

// kick has the session's queue sent by a goroutine started for it, unless one is due already or
// the RPC's goroutine is handling a request. It neither waits nor locks (Session.signal).
func (s *deltaStream) kick() {
	if s.kicked.Swap(true) || s.handling.Load() {
		return
	}
	go s.pumpKicked()
}

// pumpKicked sends the session's queue, as kick asked.
func (s *deltaStream) pumpKicked() {
	s.run(func() error {
		s.kicked.Store(false)
		return s.pump()
	})
}

// awaitRoom waits for the pending response's room (or abandon), then sends what is queued.
func (s *deltaStream) awaitRoom(w *budgetWaiter) {
	<-w.ready
	s.run(func() error {
		if s.wait != w {
			return nil // taken back meanwhile (abandon gave the room back)
		}
		s.deliver()
		return s.pump()
	})
}

// run runs f under s.mu unless the stream has closed, then flushes; an error ends the stream.
func (s *deltaStream) run(f func() error) {
	s.mu.Lock()
	var err error
	if !s.closed {
		err = f()
	}
	s.mu.Unlock()
	s.flush(0)
	s.fail(err)
}

// fail ends the stream with err, a send's error (nil: nothing failed).
func (s *deltaStream) fail(err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	if s.failed == nil {
		s.failed = err
	}
	s.mu.Unlock()
	s.close(err)
}

// request handles one request: what was answered goes out first, then the tracker hears the
// request, and the type's watch is made anew.
func (s *deltaStream) request(req *discovery.DeltaDiscoveryRequest, node **core.Node) error {
	s.mu.Lock()
	err := s.pump()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if s.tracker.stalls {
		s.mu.Lock() // the observers stall the stream, as they used to
	}
	r, err := s.tracker.request(s.st, s.id, req)
	s.tracker.tell(&r)
	if !s.tracker.stalls {
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if err != nil {
		return err
	}
	if s.closed || s.failed != nil {
		return s.failed
	}
	if req.GetNode() != nil {
		*node = req.GetNode()
	} else {
		req.Node = *node
	}
	kind := req.GetTypeUrl()
	if kind == "" {
		return status.Errorf(codes.InvalidArgument, "type URL is required for ADS")
	}
	w := s.watches[kind]
	var old *watch // the type's watch until now, which the new one may reuse
	if w == nil {
		w = &deltaWatch{sub: stream.NewDeltaSubscription(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe(), req.GetInitialResourceVersions(), true)}
		s.watches[kind] = w
	} else {
		if s.pending != nil && s.pending.kind == kind {
			s.abandon() // its watch is canceled now: its names are dirty again for the next
		}
		s.cancel(w)
		old = w.w
		w.sub.UpdateResourceSubscriptions(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe())
	}
	// The watch reads the subscription in place: it changes only once the watch is canceled.
	w.w = s.cache.openWatch(s.st, req, &w.sub, nil, old)
	s.kicked.Store(false) // what was kicked until now is sent after this request
	return s.pump()
}

// pump hands the session's answered responses over to the outbox in order while the budget has
// room; the first that does not fit stays pending until it is granted room. Call with s.mu.
func (s *deltaStream) pump() error {
	_, err := s.pumpWhile(nil)
	return err
}

// pumpWhile is pump that stops before a response when more, if not nil, says no. It reports
// whether it left the session's queue empty with nothing waiting. Call with s.mu.
func (s *deltaStream) pumpWhile(more func() bool) (bool, error) {
	if s.failed != nil {
		return false, s.failed
	}
	for s.wait == nil && (more == nil || more()) {
		if s.pending == nil {
			w := s.st.next()
			if w == nil {
				return true, nil
			}
			s.pending, s.cost = w, responseCost(w.resp.DeltaDiscoveryResponse)
		}
		if wait := s.cache.budget.tryAcquire(&s.st.acct, s.cost); wait != nil {
			s.wait = wait
			go s.awaitRoom(wait)
			return false, nil // the pending response waits for room
		}
		s.deliver()
	}
	return false, nil
}

// sendNowLimit bounds what a stream may have unanswered for a send that must not wait (sendNow,
// the RPC's goroutine): half of grpc-go's write quota of a stream, so the send never waits.
const sendNowLimit = 32 << 10

// sendNow is pump and flush on a write's fan-out, while they cannot wait: the stream's lock is
// free, the budget has room, and what is unanswered is under sendNowLimit. On false the caller
// kicks the stream, which sends the rest.
func (s *deltaStream) sendNow() bool {
	if !s.mu.TryLock() {
		return false
	}
	if s.closed {
		s.mu.Unlock()
		return true // nothing is sent any more
	}
	drained, err := s.pumpWhile(func() bool { return s.st.unanswered() < sendNowLimit })
	waiting := s.wait != nil
	s.mu.Unlock()
	if err != nil {
		s.fail(err)
		return true
	}
	return s.flush(sendNowLimit) && (drained || waiting)
}

// deliver moves the pending response, its room taken, to the outbox, numbered. Call with s.mu.
func (s *deltaStream) deliver() {
	w := s.pending
	s.pending, s.wait = nil, nil
	s.st.admitted(w, s.cost)
	out := outgoing{resp: w.resp.DeltaDiscoveryResponse, flight: w.flight, cost: s.cost}
	s.st.finish(w, true)
	if out.resp.Nonce == "" {
		s.nonce++
		out.resp.Nonce = strconv.FormatInt(s.nonce, 10)
	}
	s.outbox = append(s.outbox, out)
	s.unsent += out.cost
}

// flush sends what the outbox holds, in order, telling the tracker first, unless another
// goroutine is at it. With limit > 0 it sends only while what is unanswered is under limit, and
// reports false when it left some for another goroutine. A failed send ends the stream.
func (s *deltaStream) flush(limit int64) bool {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return true
	}
	s.draining = true
	var err error
	more := func() bool { return s.head < len(s.outbox) && err == nil && s.failed == nil && !s.closed }
	for more() && (limit <= 0 || s.st.unanswered()-s.unsent < limit) {
		out := s.outbox[s.head]
		s.outbox[s.head] = outgoing{}
		s.head++
		s.unsent -= out.cost
		s.mu.Unlock()
		s.tracker.sentFlight(s.st, s.id, out.resp, out.flight)
		err = s.str.Send(out.resp)
		s.mu.Lock()
	}
	left := more()
	if !left {
		clear(s.outbox[s.head:])
		s.outbox, s.head, s.unsent = s.outbox[:0], 0, 0
	}
	s.draining = false
	s.idle.Broadcast()
	s.mu.Unlock()
	s.fail(err)
	return !left
}

// abandon takes the pending response back, unsent: its names are dirty again. Call with s.mu.
func (s *deltaStream) abandon() {
	if w := s.pending; w != nil {
		if wait := s.wait; wait != nil {
			s.cache.budget.cancel(wait) // out of the queue, or its room given back
			select {
			case wait.ready <- struct{}{}: // awaitRoom ends (not granted: nothing else sends)
			default: // granted: ready holds its signal already
			}
		}
		s.pending, s.wait = nil, nil
		s.st.finish(w, false)
	}
}
